"""Chapter 5's two lessons: the exercises' checks (they accept the library's solutions and reject planted
mistakes), what the lessons compute from the committed results and lab/, the figures' colours, and the notebooks
(no answer imported, one steps table each)."""

import json
import re

from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from book.common import changed_lines, gap_words
from book.ternary import exercises as E
from book.ternary import lesson as L
from book.ternary import solutions as S
from book.ternary.figures import SERIES_COLOURS, figures
from studylog import paths, runtime
from studylog import ternary as T
from studylog.ternary.triton_steps import gemv_program, k_slice, store_row

LESSONS = [paths.REPO_ROOT / "notebooks" / f"{name}.ipynb" for name in T.CHAPTER.notebooks]


# ------------------------------------------------------------------------------------------------
# The exercises: each check accepts the solution and rejects a planted mistake
# ------------------------------------------------------------------------------------------------

def _half_up(x):
    scale = 127.0 / x.float().abs().max()
    return torch.floor(x.float() * scale + 0.5).clamp(-128, 127).to(torch.int8), scale


CASES = [
    (E.check_unpack_2bit, (S.unpack_group,),
     (lambda ws: [((ws[k // 16] >> (2 * (k % 16))) & 3) - 1 for k in range(256)],)),  # 16 consecutive a word
    (E.check_field_float, (S.field_float_bits,),
     (lambda w, f: ((w >> (2 * f)) & 3) | ((150 - 2 * f) << 23),)),  # a shift, and no exponent bits kept
    (E.check_base3, (S.base3_byte, S.base3_weights),
     (lambda ws: sum((w + 1) * 3 ** (4 - d) for d, w in enumerate(ws)), S.base3_weights)),  # digits reversed
    (E.check_absmean, (S.absmean,),
     (lambda w: ((w / w.abs().max()).round().clamp(-1, 1).to(torch.int8), 1 / w.abs().max()),)),  # absmax
    (E.check_mma_position, (S.mma_position,), (lambda k: (k % 16, 2 * (k // 16)),)),  # the plain 2-bit layout
    (E.check_w2a8_sum, (S.w2a8_sum,), (lambda a, s: a[0] + (a[1] >> 2) + (a[2] >> 4) + (a[3] >> 6),)),  # no x sum
    (E.check_round_int8, (S.round_int8,), (_half_up,)),  # half up, not half to even
    (E.check_ring_waits, (S.ring_waits,), (lambda c, s: (c % s, c & 1, None if c < s else c & 1),)),  # chunk parity
]


@pytest.mark.parametrize("check, right, wrong", CASES, ids=[c[0].__name__ for c in CASES])
def test_exercise_checks_accept_the_solution_and_reject_a_mistake(check, right, wrong, capsys):
    assert check(*right) is True
    assert check(*wrong) is False
    assert "wrong:" in capsys.readouterr().out


@triton.jit
def _gemv_low_half_twice(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                         BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr):
    # Exercise 6 with a planted mistake: fields 8..15 decoded from the low half again (shift 2 (f % 8), not 2 f).
    pid_k, m, rows, row_mask, p_rows, x_row = gemv_program(x_ptr, p_ptr, N, stride_xm, stride_pn, BLOCK_N)
    kw_start, kw_end = k_slice(pid_k, KW, SPLIT_K, BLOCK_KW)
    offs_w = tl.arange(0, BLOCK_KW)
    x_of_word = (offs_w // 16) * 256 + offs_w % 16
    acc = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        kw = kw0 + offs_w
        words = tl.load(p_rows + kw[None, :], mask=row_mask[:, None] & (kw < kw_end)[None, :], other=0x55555555)
        offs_k = kw0 * 16 + x_of_word
        for f in tl.static_range(16):
            x = tl.load(x_row + offs_k + 16 * f, mask=offs_k + 16 * f < K, other=0.0).to(tl.float32)
            acc += (((words >> (2 * (f % 8))) & 3) - 1).to(tl.float32) * x[None, :]
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    store_row(z_ptr, tl.sum(acc, axis=1) / scale, m, stride_zm, rows, row_mask, SPLIT_K)


@triton.jit
def _gemv_codes(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr):
    # Exercise 6 with a planted mistake: the code (w + 1) taken for the weight, the 1 never subtracted.
    pid_k, m, rows, row_mask, p_rows, x_row = gemv_program(x_ptr, p_ptr, N, stride_xm, stride_pn, BLOCK_N)
    kw_start, kw_end = k_slice(pid_k, KW, SPLIT_K, BLOCK_KW)
    offs_w = tl.arange(0, BLOCK_KW)
    x_of_word = (offs_w // 16) * 256 + offs_w % 16
    acc = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        kw = kw0 + offs_w
        words = tl.load(p_rows + kw[None, :], mask=row_mask[:, None] & (kw < kw_end)[None, :], other=0x55555555)
        offs_k = kw0 * 16 + x_of_word
        for f in tl.static_range(16):
            x = tl.load(x_row + offs_k + 16 * f, mask=offs_k + 16 * f < K, other=0.0).to(tl.float32)
            acc += ((words >> (2 * f)) & 3).to(tl.float32) * x[None, :]
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    store_row(z_ptr, tl.sum(acc, axis=1) / scale, m, stride_zm, rows, row_mask, SPLIT_K)


def test_the_kernel_check_accepts_the_solution_and_step_4_and_rejects_planted_mistakes(capsys):
    assert E.check_gemv_kernel(S.gemv_shifts_kernel, time_it=False) is True
    assert E.check_gemv_kernel(T.step05_gemv_kernel, time_it=False) is True  # the kernel the reader copies
    for wrong in (_gemv_low_half_twice, _gemv_codes):
        capsys.readouterr()
        assert E.check_gemv_kernel(wrong, time_it=False) is False
        assert "wrong: x " in capsys.readouterr().out


def test_the_kernel_check_gives_the_pages_stub_a_note(capsys):
    @triton.jit
    def stub(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
             BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr):
        raise NotImplementedError  # the page's stub

    assert E.check_gemv_kernel(stub) is False
    assert "not written yet" in capsys.readouterr().out


def test_the_kernel_check_says_it_does_not_time_on_a_cpu(capsys):
    if runtime.mode() == "gpu":
        pytest.skip("on a GPU the check times the kernel")
    assert E.check_gemv_kernel(S.gemv_shifts_kernel) is True
    assert "no timing here" in capsys.readouterr().out


def test_the_cuda_kernel_exercise_compiles_the_answer_and_rejects_non_answers(capsys):
    """Exercise 12 on a CPU: NVRTC compiles the reader's step 21 and the check counts the SASS's moves of the
    constant (the GPU part says it was skipped); an unchanged source, a comment, or a source that does not compile
    fail."""
    assert E.check_magic_literal(S.magic_literal)
    out = capsys.readouterr().out
    assert "magic moves" in out and ("no Hopper GPU" in out) is not (runtime.has_gpu()
                                                                     and torch.cuda.get_device_capability()[0] >= 9)
    for wrong, says in ((lambda s: s, "unchanged"),
                        (lambda s: s.replace("// see decode_pair_reg", "// the constant"), "no more moves"),
                        (lambda s: s + "\nnot C++\n", "does not compile")):
        assert not E.check_magic_literal(wrong)
        assert says in capsys.readouterr().out


def test_a_check_survives_a_function_that_returns_the_wrong_shape(capsys):
    assert E.check_unpack_2bit(lambda ws: [0] * 255) is False
    assert "255 weights" in capsys.readouterr().out


def test_every_check_is_called_by_a_lesson():
    code = "\n".join("".join(c["source"]) for p in LESSONS for c in json.loads(p.read_text())["cells"]
                     if c["cell_type"] == "code")
    called = set(re.findall(r"exercises\.(check_\w+)\(", code))
    assert called == {name for name in E.__all__ if name.startswith("check_")}


# ------------------------------------------------------------------------------------------------
# What the lessons compute
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def results():
    res = L.load()
    if res is None:
        pytest.skip("no committed results")
    return res


def test_amdahl_view_is_a_fraction_and_bounded(results):
    view = L.amdahl(results)
    assert 0.5 < view["share"] < 1.0  # the ternary layers dominate a BitNet decode step's bytes
    assert view["weights"] == 30 * (2 * 2560 * 2560 + 2 * 640 * 2560 + 3 * 6912 * 2560)
    if view["speedup"] is not None:
        assert 1.0 < view["end_to_end"] < min(view["speedup"], view["limit"])


def test_amdahl_estimates_on_the_share_of_time_not_of_bytes(results):
    """One method: the whole-step estimate is Amdahl's law on the ternary layers' share of a step's time, their
    cuBLAS bf16 times (count-weighted, 30 transformer layers) against the LM head and KV cache at the copy bandwidth
    (their floor), recomputed here; never the byte share beside a time speedup."""
    view = L.amdahl(results, [T.SERIES[14]])
    if view["speedup"] is None:
        pytest.skip("no layer times")
    base = 0.0  # one transformer layer's ternary matmuls as cuBLAS bf16, each layer where lesson.amdahl times it
    for _, n, k, count, shape in L.BITNET_LAYERS:
        source, at, _ = L.layer_source(results, L.layer_run(results), n, k, shape)
        base += count * L.us(source, L.CUBLAS, at)
    rest = sum(view["rest"].values()) / (results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9) * 1e6
    share = 30 * base / (30 * base + rest)
    assert view["time_share"] == pytest.approx(share, rel=1e-12) and view["time_share"] > view["share"]
    assert view["end_to_end"] == pytest.approx(1 / ((1 - share) + share / view["speedup"]), rel=1e-12)
    assert view["limit"] == pytest.approx(1 / (1 - share), rel=1e-12)


def test_part_1s_amdahl_view_uses_step_14_only(results):
    """Part 1's opening prices the model's layers with its own last step (step 14), never part 2's kernels."""
    only14, every = L.amdahl(results, [T.SERIES[14]]), L.amdahl(results)
    if only14["speedup"] is not None:
        assert {series for _, series in only14["per_shape"].values()} == {T.SERIES[14]}
        assert only14["speedup"] <= every["speedup"]
        table = L.amdahl_layers_table(results, [T.SERIES[14]])
        assert "step21" not in table and "step17" not in table
        kv = next(line for line in table.splitlines() if line.startswith("| k, v "))
        if L.layer_run(results) is None:  # the k, v row and the caption say where k and v were not run
            assert "estimate" in kv and "estimate" in table.splitlines()[0]
        else:
            assert "| 640 × 2560 |" in kv and "estimate" not in table


def test_amdahl_times_every_layer_at_its_own_shape_where_the_lab_run_is_committed(results):
    """With lab/ternary's run of the four layer shapes, k and v are timed at 640 x 2560 (not charged q's time) in
    that run, the other layers in the benchmark (one time a kernel and shape on a page), and the speedup is the
    ratio of the count-weighted sums, recomputed here from the raw rows of the two files."""
    import json

    from studylog import paths

    path = paths.LAB / "ternary" / "results" / Path(results.path).parent.name / f"{L.LAYER_RUN}.json"
    if not path.is_file():
        pytest.skip("no layer run on this card")
    lab = [r for r in json.loads(path.read_text())["measurements"] if r["clock"] == "gpu"]
    bench = [r for r in json.loads(results.path.read_text())["measurements"] if r.get("clock") == "gpu"]

    def ms(series, n, k):
        for rows in (bench, lab):  # the benchmark first: the lab run only for the shapes it lacks
            found = [r["ms"] for r in rows if r["series"] == series and r["params"].get("n") == n
                     and r["params"].get("k") == k and r["params"].get("m") == 1]
            if found:
                return found[0]

    view = L.amdahl(results, [T.SERIES[21]])
    assert view["measured"] and "640x2560" in view["per_shape"] and L.layers_note(view).startswith("every layer")
    assert view["separate"] == ["640x2560"] and L.layers_note(view) == "every layer at its own shape"
    assert "k and v (640 × 2560) were timed in a second run" in L.amdahl_layers_table(results, [T.SERIES[21]])
    base = sum(c * ms("cublas_bf16", n, k) for _, n, k, c, _ in L.BITNET_LAYERS)
    ours = sum(c * ms(T.SERIES[21], n, k) for _, n, k, c, _ in L.BITNET_LAYERS)
    assert view["speedup"] == pytest.approx(base / ours, rel=1e-12)


def test_the_result_table_can_keep_to_one_launch_of_step_23(results):
    table = L.result_table(results, cases=((L.MAIN, 1), (L.MAIN, 16)), w2a8=(T.SERIES[23], T.SERIES[25]))
    assert "quantised" not in table  # no other place to quantise x than step 23's default
    row = next(line for line in table.splitlines() if line.startswith(f"| {L.MAIN.replace('x', ' × ')}, 1 |"))
    assert f"{L.us(results, T.SERIES[23]):.1f} (" in row


@pytest.mark.parametrize("step, needs", [
    (18, ("mbarrier_wait(&empty", "mbarrier_expect_bytes", "bulk_copy(", "mbarrier_wait(&full", "mbarrier_arrive")),
    (22, ("w2a8_sum(", "w2a8_z(", "sum - x_sum")),
])
def test_each_cuda_steps_excerpt_is_short_real_code_and_carries_its_idea(step, needs):
    """A listing the page shows unfolded: the source's own lines (comments and pragmas kept, no stub saying what was
    cut), short, its blocks closed."""
    shown = L.excerpt(step)
    text = shown.text
    assert all(n in text for n in needs), [n for n in needs if n not in text]
    assert len(text.splitlines()) <= 30 and "lines of comment" not in text and "left out" not in shown.title
    assert text.count("{") == text.count("}")  # the blocks a region leaves open are closed
    from studylog import cuda

    source = Path(cuda.source_path(L.EXCERPTS[step][0])).read_text()
    lines = source.splitlines()  # each shown line is a source line, or a piece of one broken to fit the frame
    assert all(any(line.strip().lstrip("/ ") in s for s in lines)
               for line in text.splitlines() if line.strip() not in ("}", "// ..."))
    assert max(len(line) for line in text.splitlines()) <= 105


def test_step_table_says_pending_where_the_file_has_no_gpu_clock(results):
    table = L.step_table(results, [1, 23])
    assert "`step01_sign`" in table and "`step23_w2a8_fused`" in table
    if L.us(results, T.SERIES[1]) is None:
        assert L.PENDING in table.split("`step01_sign`")[1].splitlines()[0]
    assert L.step_table(None, [23]).count(L.PENDING) == 3 * 2


def test_probe_table_uses_one_clock_for_the_step_and_its_probes(results):
    table, clock = L.probe_table(results, 21)
    assert clock == "GPU clock"
    whole = L.probe_us(results, 21, None)
    assert f"{whole:.1f}" in table.splitlines()[2]


def test_card_tables(results):
    cards = L.cards()
    assert cards and all(0 < (L.bandwidth_share(r) or 0.5) < 1.2 for r in cards.values())


def test_in_flight_follows_littles_law():
    flight = L.in_flight(4096, 14336, 3000.0)
    assert flight["bytes"] == flight["per_block"] * flight["blocks"]
    assert flight["latency_us"] == pytest.approx(flight["bytes"] / 3e12 * 1e6)


def test_sass_counts_show_what_each_step_removes():
    if L.cuobjdump() is None:
        pytest.skip("no cuobjdump to read SASS with")
    c17, c20, c21, c23 = (L.sass_counts(s) for s in (17, 20, 21, 23))
    assert c17["magic moves"] > 0 and c20["magic moves"] > 0 and c21["magic moves"] == 0  # step 21: in a register
    literal = L.magic_literal_counts()  # the page: the inline LOP3 removes most moves, the shared-memory read the rest
    assert 0 < literal["magic moves"] < c20["magic moves"] / 2
    assert c23["IMMA"] == 8 and c23["HMMA"] == 0 and c23["HFMA2"] == 0  # steps 22 and 23: no float decode


def test_figures_give_each_series_one_colour(results):
    assert len(set(SERIES_COLOURS.values())) == len(SERIES_COLOURS)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = figures(results)
    for name, fig in figs.items():
        assert len(fig.axes) <= 3, name
        plt.close(fig)


def test_a_peer_bar_whisker_spans_that_peers_repetitions_alone(results):
    """Each bar of the peers figure is a rival's median over our fastest kernel's; its whisker must run from the
    rival's fastest to its slowest repetition over that same median of ours (our spread is not the rival's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    from book.ternary.figures import W2A8_DEFAULTS
    from studylog.ternary.results import INT_MM, fastest

    figs = figures(results)
    ax = next(a for a in figs["peers"].axes if a.get_title().endswith("M = 16"))
    shape = "13824x2560"
    peer = json.loads(results.path.read_text())
    row = next(r for r in peer["measurements"] if r["series"] == INT_MM
               and r["params"].get("shape") == shape and r["params"].get("m") == 16 and r.get("clock") == "gpu")
    ours, _ = fastest(results, W2A8_DEFAULTS, shape=shape, m=16)
    lo, hi = row["spread_ms"][0] / ours["ms"], row["spread_ms"][2] / ours["ms"]
    segments = [seg for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments()]
    assert any(len(seg) == 2 and abs(seg[0][1] - lo) < 1e-9 and abs(seg[1][1] - hi) < 1e-9 for seg in segments)
    for fig in figs.values():
        plt.close(fig)


# ------------------------------------------------------------------------------------------------
# The notebooks
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_imports_no_answer_and_shows_one_steps_table(path):
    """One steps table open on a page. Part 1's gives one number a step: steps 1 to 5 at one row of x, steps 6 and 10
    to 14 at 16 rows (the rows they are built for); every step at both, GemLite beside, and the tried steps 7 to 9
    are folded tables under it. Part 2's table, at one row, has a role column beside each step; at 16 rows it sits in
    a fold, as do its tried steps."""
    cells = json.loads(path.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "solutions" not in code and "glue(" not in code
    folded = lambda c: "hide-output" in c["metadata"].get("tags", [])  # noqa: E731
    calls = [("".join(c["source"]), folded(c)) for c in cells
             if c["cell_type"] == "code" and "lesson.boehm_table(" in "".join(c["source"])]
    open_ = [text for text, hidden in calls if not hidden]
    if path == LESSONS[0]:
        one = [c for c in cells if "lesson.one_number_table(" in "".join(c["source"])]
        assert len(one) == 1 and not folded(one[0]) and not open_ and "r not in tried_rows" in "".join(one[0]["source"])
        hidden = [t for t, h in calls if h]
        assert len(hidden) == 2 and "rows_of_x=1, beside=16, at=at)" in hidden[0]
        assert hidden[1] == "display(Markdown(lesson.boehm_table(results, tried_rows, rows_of_x=1, beside=16)))"
        assert cells.index(one[0]) + 1 == next(i for i, c in enumerate(cells) if "beside=16, at=at)" in "".join(c["source"]))
    else:
        assert len(open_) == 1 and open_[0].count("lesson.boehm_table(") == 1
        assert "rows_of_x=1)" in open_[0] and "roles=lesson.part2_role" in open_[0]
        hidden = [text for text, hidden in calls if hidden]
        assert [text.count("rows_of_x=16)") for text in hidden] == [1, 0]
        assert "roles=lesson.part2_role" in hidden[0] and "lesson.part2_tried(bitnet_run)" in hidden[1]


ROW = re.compile(r"^\| (\d+) \|", flags=re.M)  # a steps table's row: "| 17 |"


def test_the_boehm_table_has_one_row_a_step(results):
    table = L.boehm_table(results, L.PART2_ROWS)
    assert len(ROW.findall(table)) == len(L.PART2_ROWS)
    assert table.count("| step | the change | µs | × previous | × the 2-bit floor |") == len(
        {m for _, m, _, _ in L.PART2_ROWS})
    assert all(L.card(results) in line for line in table.splitlines() if line.startswith("**"))  # the card named
    wide = L.boehm_table(results, L.PART2_ROWS, read_only=True)
    assert wide.count("| × the 2-bit floor | × read-only |") == len({m for _, m, _, _ in L.PART2_ROWS})
    reader = L.us(results, "read_weights")
    row23 = next(line for line in wide.splitlines() if line.startswith("| 23 |"))
    assert row23.rstrip(" |").endswith(f"{L.us(results, T.SERIES[23]) / reader:.1f}")


def test_part_2s_steps_table_gives_each_step_one_row_against_the_step_before_it(results):
    """One step, one row, one number: the main table has a row for each step the page keeps at one row of x, steps
    15 to 23, each measured against the step before it, and a role column: a step slower than the step before it,
    or (the second of a pair) than the step before the pair, is a "prerequisite of N", N the step that builds on it
    and pays; a tie says why it is kept; a pair's second step gives its speed over the step before the pair. At 16
    rows step 23 follows part 1's step 14. Steps 24 and 25, a tried path built for several rows of x, sit in a table
    of their own and say so in their rows, never "did not pay"."""
    assert "did not pay" not in "".join(c for *_, c in L.PART2_ROWS + L.PART2_TRIED)
    assert not hasattr(L, "PAIRS") and not hasattr(L, "pair_chain") and not hasattr(L, "PART2_HALVES")
    one = [(n, p) for n, m, p, _ in L.PART2_ROWS if m == 1]
    assert one == [(14, None)] + [(n, n - 1) for n in range(15, 24)]
    assert [(n, p) for n, m, p, _ in L.PART2_ROWS if m == 16] == [(14, None), (23, 14)]
    assert [(n, m, p) for n, m, p, _ in L.PART2_TRIED] == [(24, 1, 23), (25, 1, 24), (24, 16, 23), (25, 16, 24)]
    for rows in (L.PART2_ROWS, L.PART2_TRIED):
        table = L.boehm_table(results, rows)
        assert " + " not in "".join(ROW.findall(table))
        lines = [line for line in table.splitlines() if ROW.match(line)]
        assert len(lines) == len(rows)
        for (number, m, previous, change), line in zip(rows, lines):
            assert line.startswith(f"| {number} |"), line
            if previous is not None:
                t, before = L.us(results, T.SERIES[number], L.MAIN, m), L.us(results, T.SERIES[previous], L.MAIN, m)
                assert f"| {before / t:.2f}× (vs {previous}{'; tie' if L.is_tie(before / t) else ''}) |" in line, line
            assert change.startswith("tried, for several rows") == (number in (24, 25)), line
    table = L.boehm_table(results, L.PART2_ROWS, roles=L.part2_role, rows_of_x=1)
    assert "| step | role | the change | µs | × previous | × the 2-bit floor |" in table
    for number, m, previous, _ in L.PART2_ROWS[:10]:
        role = next(line for line in table.splitlines() if line.startswith(f"| {number} |")).split(" | ")[1]
        if previous is None:
            assert role == "baseline"
            continue
        t = L.us(results, T.SERIES[number])
        r = L.us(results, T.SERIES[previous]) / t
        start = L.PART2_PAIRS.get(number)
        whole = None if start is None else L.us(results, T.SERIES[start]) / t
        if L.is_tie(r):
            assert role == f"tie, kept because {L.PART2_TIES_KEPT[number]}", role
        elif r < 1 or (whole is not None and whole < 1):  # slower alone, or the pair still behind: a prerequisite
            assert role.startswith(f"prerequisite of {L.PART2_NEEDED_BY[number]}"), role
        else:
            assert role.startswith("**pays**"), role
        if start is not None:
            assert f"({whole:.2f}× step {start})" in role, role
    assert [n for n in range(15, 24) if "prerequisite" in L.part2_role(results, n, 1, n - 1)] == [15, 16, 18, 22]
    # the ties are steps whose keeping the page explains (the run decides which of them tie: 21 ties 20 or pays)
    ties = [n for n in range(15, 24) if L.part2_role(results, n, 1, n - 1).startswith("tie")]
    assert 20 in ties and set(ties) <= set(L.PART2_TIES_KEPT), ties


def test_the_chapter_lists_both_lessons():
    assert T.CHAPTER.notebooks == ("05_ternary_1_triton", "05_ternary_2_cuda")
    assert all(p.is_file() for p in LESSONS)
    assert not (paths.REPO_ROOT / "notebooks" / "05_ternary_matmul.ipynb").exists()


# ------------------------------------------------------------------------------------------------
# Part 2's page: comment runs cut from diffs, step 12's places, step 13's undone change, GemLite's check
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_shows_its_listings_uncut(path):
    """Diffs and listings reach the page as the source has them: no helper that cuts comment runs to a stub."""
    code = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    assert "short_comments" not in code and not hasattr(L, "short_comments")


def test_step_23s_places_table_bolds_the_default_time(results):
    table = L.w2a8_places_table(results)
    staged = next(line for line in table.splitlines() if line.startswith("| staged |"))
    assert f"**{L.us(results, T.SERIES[23]):.1f}**" in staged  # one row of x: staged is step 23's default
    assert table.count("**") == 2 * 2  # one default a column of rows of x


def test_the_main_tables_have_no_lettered_rows(results):
    """One row a numbered step, no lettered rows: each change is a step of its own."""
    for rows in (L.PART1_ROWS, L.PART2_ROWS):
        table = L.boehm_table(results, rows)
        assert not re.search(r"^\| \d+[a-z] \|", table, flags=re.M), table
        assert "added" not in table and "undone" not in table and "alone (vs" not in table
    for number in (7, 8, 9):  # tried and slower than the step it builds on: said in the cell
        number_, m, previous, change = next(r for r in L.PART1_ROWS if r[0] == number)
        assert L.us(results, T.SERIES[previous], L.MAIN, m) < L.us(results, T.SERIES[number], L.MAIN, m)
        assert "did not pay" in change


def _sections(path) -> dict[int, str]:
    """Each numbered step's section of a page: its heading and the Markdown up to the next heading, by step."""
    out, step = {}, None
    for cell in json.loads(path.read_text())["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] != "markdown":
            continue
        head = re.match(r"#+ Steps? (\d+)[: ]", text)
        if head:
            step = int(head[1])
            out[step] = text
        elif text.startswith("#"):
            step = None
        elif step is not None:
            out[step] += "\n" + text
    return out


def _openings(path) -> dict[int, str]:
    """Each numbered step's opening: the source of the first cell after its heading."""
    cells = json.loads(path.read_text())["cells"]
    out = {}
    for cell, after in zip(cells, cells[1:]):
        head = re.match(r"#+ Step (\d+):", "".join(cell["source"])) if cell["cell_type"] == "markdown" else None
        if head:
            out[int(head[1])] = "".join(after["source"]) if after["cell_type"] == "code" else ""
    return out


def test_part_1s_steps_run_1_to_14_down_the_page_and_in_its_table(results):
    """Steps 7, 8 and 9 (tried, did not pay) each have a heading of their own in their numeric place, between steps 6
    and 10 (no heading covers two steps), and one bold number said open; step 7's format and short diff sit in a fold;
    steps 10 to 12, step 13's prerequisites, each have a section of their own, step 10's naming step 6 as the step
    steps 10 to 14 build on; each steps table's rows run upward."""
    cells = json.loads(LESSONS[0].read_text())["cells"]
    heads = [("".join(c["source"]).splitlines() or [""])[0] for c in cells if c["cell_type"] == "markdown"]
    numbered = [(h, int(re.match(r"## Step (\d+):", h)[1])) for h in heads if re.match(r"## Step \d+:", h)]
    assert [n for _, n in numbered] == [1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14]
    grouped = next(h for h, n in numbered if n == 10)
    assert not any("did not pay" in h for h, _ in numbered)
    assert not any(h.startswith("## Tried") or re.match(r"## Steps \d+", h) for h in heads)
    tried = [h for h in heads if re.match(r"## Step \d+, tried: ", h)]
    assert [int(re.match(r"## Step (\d+)", h)[1]) for h in tried] == [7, 8, 9]
    assert heads.index("## Step 6: several rows of x with `tl.dot`") < heads.index(tried[0])
    assert heads.index(tried[-1]) < heads.index(grouped)
    text = ["".join(c["source"]) for c in cells]
    shown = 0
    for number, head in zip((7, 8, 9), tried):
        at = text.index(head)
        end = next(i for i in range(at + 1, len(text)) if text[i].startswith("## "))
        said = "".join(t for c, t in zip(cells[at + 1:end], text[at + 1:end])
                       if c["cell_type"] == "code" and "hide-output" not in c["metadata"]["tags"])
        assert said.count("**") == 2 and f"us({number}" in said and f"say(f\"Step {number} " in said, number
        folded = "".join(t for c, t in zip(cells[at + 1:end], text[at + 1:end])
                         if c["cell_type"] == "code" and "hide-output" in c["metadata"]["tags"])
        assert "core(" not in said and "show(" not in said
        shown += folded.count("core(") + folded.count("show(")
    assert shown == 1  # step 7's diff, folded
    assert "prepare step 13's layout" in _sections(LESSONS[0])[10]
    for m in (1, 16):
        steps = [n for n, rows_of_x, _, _ in L.PART1_ROWS if rows_of_x == m]
        assert steps == sorted(steps)
    for number, m, previous, change in L.PART1_ROWS:
        assert change.startswith("tried, did not pay") == (number in (7, 8, 9))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_fold_labels_are_plain_text(path):
    """A fold's label renders as it is typed: no Markdown (backticks, asterisks) in it."""
    labels = [v for c in json.loads(path.read_text())["cells"]
              for k, v in c["metadata"].get("mystnb", {}).items() if k.startswith("code_prompt")]
    assert labels
    for label in labels:
        assert "`" not in label and "*" not in label, label


def test_part_2_says_where_to_quantise_x_at_bitnets_shapes(results):
    """At one row, step 23 stages x for a long row (K >= W2A8_STAGED_MIN_K) unless staging costs a wave, and
    quantises it in every block otherwise: at BitNet's 5120 x 27648 staged x leaves one block an SM and two waves
    against one; BitNet's other shapes are short rows. At every shape the chapter times both ways, the rule's place is
    the faster one or a tie. Computed from the committed file."""
    from book.ternary import results as tables
    from studylog.ternary.w2a8 import W2A8_STAGED_MIN_K

    bitnet = tables.bitnet_table(tables.bitnet_results(results))
    waves = L.place_waves(results, [s for s, *_ in bitnet["rows"]])
    assert len(waves) == len(bitnet["rows"])
    big = max(waves, key=lambda s: waves[s]["gain"])
    assert big == "5120x27648" and waves[big]["default"] == "every block" and waves[big]["gain"] > 1.2
    assert waves[big]["staged launch"]["per_sm"] == 1 and waves[big]["every block launch"]["per_sm"] == 2
    assert waves[big]["staged launch"]["waves"] == 2 and waves[big]["every block launch"]["waves"] == 1
    for s, r in waves.items():
        long_row = int(s.split("x")[1]) >= W2A8_STAGED_MIN_K
        assert r["default"] == ("staged" if long_row and s != big else "every block"), s
    both = L.place_waves(results, [L.MAIN, L.BIG, "14336x4096"] + [s for s, *_ in bitnet["rows"]])
    assert len(both) == len(waves) + 3 and {r["default"] for r in both.values()} == {"staged", "every block"}
    for s, r in both.items():  # the rule's place over the other's: faster, or a tie
        ratio = r["gain"] if r["default"] == "every block" else 1 / r["gain"]
        assert ratio > 1 or L.is_tie(ratio), (s, r)
    code = "".join("".join(c["source"]) for c in json.loads(LESSONS[1].read_text())["cells"])
    assert "lesson.place_times(results" in code and "lesson.place_waves(results" in code
    # where we lose: the rule, why, and what the shapes timed both ways say, counted from the same numbers
    lose = next("".join(c["source"]) for c in json.loads(LESSONS[1].read_text())["cells"] if c["id"] == "812e9119")
    assert "W2A8_STAGED_MIN_K" in lose and "staged_wins" in lose and "slower beyond a tie at" in lose
    assert "lesson.place_waves(results, [MAIN, BIG, \"14336x4096\"]" in lose and "a wait that grows with K" in lose
    headline = next("".join(c["source"]) for c in json.loads(LESSONS[1].read_text())["cells"] if c["id"] == "c383ddc8")
    assert "step 23 quantises x in the slower place (up to" in headline  # first
    assert "max(beaten.values())" in headline  # open, sized
    # our least lead, what the other place would make it, and the rule, from the same numbers
    assert "low[1] * 1e3 / place_runs[low[0]]['every block']" in headline
    assert "[its rule](#where-we-lose)" in headline
    assert "At 16 rows of x use part 1's \"\n        f\"step 14: step 23 runs at {x(us(14, m=16), us(23, m=16))}" in headline


def test_part_2s_result_opens_with_bitnet_and_the_eager_caveat_and_it_ends_with_a_choice():
    cells = json.loads(LESSONS[1].read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    result = next(i for i, t in enumerate(text) if t.startswith("## The result"))
    first = text[result + 1]
    assert "Against BitNet's own W2A8 kernel" in first and "eager['slower_eager']" in first
    assert first.index("BitNet's own") < first.index("slower_eager") < first.index('bitnet["table"]')
    assert text.index(next(t for t in text if "lesson.result_table(" in t)) > result + 1
    exercises = next(i for i, t in enumerate(text) if t.startswith("## Exercises"))
    assert "**Which kernel to use.**" in text[exercises - 1]


def test_part_2_prints_step_23_against_cublas_one_way_and_the_eager_choice_with_its_cost(results):
    """Step 23's speedup over cuBLAS at 4096 × 14336 and one row, printed in the rivals table, in "Where we lose" and
    in the two cards' fold, is one value: the ratio of the two times as the rivals table prints them (one decimal), to
    one decimal. The choice's eager row says, from the run with BitNet's kernel, what the plan and the plain function
    cost on the host a call and at how many shapes each is slower than BitNet's kernel."""
    from book.ternary import results as tables

    cells = {c["id"]: "".join(c["source"]) for c in json.loads(LESSONS[1].read_text())["cells"]}
    assert 'return fmt(lesson.ratio(*(None if v is None else round(v, 1) for v in (a, b))), ".1f", "×")' \
        in cells["3cf3f0bb"]
    assert "{x1(us('cublas_bf16'), us(23))} cuBLAS" in cells["5286376d"]
    assert "x1(us('cublas_bf16', m=16), best16['ms'] * 1e3)" in cells["5286376d"]
    assert 'speed = {c: x1(us("cublas_bf16", res=r), t12[c])' in cells["79c98281"]
    assert not re.search(r"[^1]\(us\(['\"]cublas_bf16", cells["5286376d"] + cells["79c98281"])
    base, t23 = (round(L.us(results, s, L.MAIN, 1), 1) for s in ("cublas_bf16", T.SERIES[23]))
    table = L.result_table(results, cases=((L.MAIN, 1),), w2a8=(T.SERIES[23],))
    assert f"{t23:.1f} ({base / t23:.1f}×, step 23" in table
    choice = cells["b51a6c2c"]
    assert "plan['slower_eager']" in choice and "eager['ours']" in choice and "plan['host']" in choice
    eager = tables.bitnet_host(tables.bitnet_results(results))
    if eager is not None and eager["plan"] is not None:  # the data behind the row's words
        assert eager["plan"]["slower_eager"] <= eager["slower_eager"]


#: Part 1's cells whose diffs sit in a fold: step 7 (tried), steps 11 and 12 (step 13's prerequisites, 1-5%
#: each) and step 14 (1.04x), so that step 13, which carries the result, gets the space.
PART1_FOLDED_DIFFS = ("33cd022c", "f75f917b", "55be03ee")
#: Part 2's folded diffs besides the tried steps': the halves of its two paired steps (16, 18 from 17, and 19).
PART2_FOLDED_DIFFS = ("7ffa9649", "f94df90a", "022d863b")

#: What a code cell calls to show a diff or a listing.
SHOWS = re.compile(r"^(show|core)\(|show_diff\(|show_source\(|core_diff\(|device_diff\(|excerpt\(|_listing\(|"
                   r"group_diff\(", flags=re.M)


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_page_shows_each_steps_core_open_and_folds_no_listing(path):
    """A page shows its lesson: each diff or listing open and short (at most 40 changed lines, or 40 lines), the
    core of a long change rather than all of it; no fold holds a whole diff or a long listing. The Little's-law
    arithmetic stays behind its fold."""
    from book.ternary.lesson import group_mma_listing, triton_core, w2a8_group_diff

    for c in json.loads(path.read_text())["cells"]:
        src = "".join(c["source"])
        folded = "hide-output" in c["metadata"].get("tags", [])
        if c["cell_type"] != "code":
            continue
        if folded:
            assert c["metadata"].get("mystnb", {}).get("code_prompt_show", "").startswith("Show ")
            # a fold holds no diff and no listing but the first attempt's, which is short, and the diffs of part 2's
            # tried steps 24 and 25, which lose at the headline case
            tried = (src.strip() in ("display(lesson.core_diff(24))", "show(25)") and path == LESSONS[1]) or (
                c["id"] in PART2_FOLDED_DIFFS and path == LESSONS[1]) or (
                c["id"] in PART1_FOLDED_DIFFS and path == LESSONS[0])
            assert tried or not SHOWS.search(src.replace("first_attempt_excerpt(", "")), src[:80]
            assert len(L.first_attempt_excerpt().splitlines()) <= 30 or "first_attempt_excerpt(" not in src
            continue
        assert "Little's law" not in src and "config_dict(c).items()" not in src, src[:80]
        assert "show_diff(" not in src or "def show(" in src, src[:80]  # part 1's one diff helper
        diffs = [L.kernel_diff(int(old), int(new)) for old, new in re.findall(r"^show\((\d+), (\d+)\)", src, flags=re.M)]
        diffs += [triton_core(int(step)) for step in re.findall(r"^core\((\d+)\)", src, flags=re.M)]
        diffs += [L.device_diff(int(step), region=L.DEVICE_CORE[int(step)] if core else None)  # part 2's
                  for step, core in re.findall(r"^show\((\d+)(, region=lesson.DEVICE_CORE\[\d+\])?\)$", src, flags=re.M)]
        diffs += [L.core_diff(int(step)) for step in re.findall(r"lesson\.core_diff\((\d+)\)", src)]
        diffs += [w2a8_group_diff()] if "w2a8_group_diff()" in src else []
        for diff in diffs:
            assert len(diff.added) + len(diff.removed) <= 40, diff.new_name
        if "group_mma_listing()" in src:
            assert len(group_mma_listing().text.splitlines()) <= 40


def test_the_shown_cuda_listings_fit_their_frame():
    """The CUDA listings built for the page break their long lines (after a comma, inside a call's or signature's
    parentheses), so that they read without scrolling; the code is the same but for its line breaks."""
    from studylog import cuda, source

    listing = L.group_mma_listing()
    assert "steps 15 to 21" in listing.title
    assert max(len(line) for line in listing.text.splitlines()) <= 105
    original = source.source_of(cuda.source_path("ternary_common.cuh"), "group_mma")[0]
    code = lambda text: re.sub(r"\s+", "", re.sub(r"//.*", "", text))  # noqa: E731
    notes = lambda text: sorted(m.strip() for m in re.findall(r"//(.*)", text))  # noqa: E731
    assert code(listing.text) == code(original) and notes(listing.text) == notes(original)
    assert max(len(line) for line in L.w2a8_group_diff().lines[2:]) <= 106


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_has_no_internal_words_or_unclear_it(path, results):
    cells = json.loads(path.read_text())["cells"]
    text = " ".join("".join(c["source"]) if c["cell_type"] == "markdown" else " ".join(_literal_text("".join(c["source"])))
                    for c in cells)
    for word in (r"\blinks?\b", r"\bfrozen\b", r"lab's copy", r"\bit fails\b", r"library's kernel"):
        assert not re.search(word, text), word


def _chain_rows(table: str) -> list[list[str]]:
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[1:]]


#: The lab runs each page reads beside the benchmark (by page: part 1, part 2), and what in a page's code reads each
#: (a call of the page's own, or a lesson function that reads it).
PAGE_RUNS = ({L.LAYER_RUN: "lesson.amdahl_layers_table(", "bundled_steps": 'load_lab("ternary", "bundled_steps")'},
             {L.LAYER_RUN: "lesson.amdahl(results, [STEP[23].series])", "step22_parts": 'load_lab("ternary", "step22_parts")',
              "w2a8_tiles_ncu_m16.txt": 'lesson.ncu_metrics("w2a8_tiles_ncu_m16.txt")'})
CLOSING = "## Where the numbers come from"
#: A path or file name of a committed result: the page names its runs in words (the card, what was run).
RESULT_PATH = re.compile(r"lab/|assets/bench|results/nvidia|\.json\b|\.txt\b|\.csv\b")


@pytest.mark.parametrize("part", [1, 2])
def test_each_page_names_its_runs_in_words_and_reads_them(results, part):
    """Every number traces to a committed run: the page's cells read the chapter's benchmark of each card and each
    lab run (the files exist); the page ends (before Further reading) with those runs named in words, in one fold
    with the card, date and versions; no path or file name of a result appears anywhere on the page."""
    gpu = results.path.parent.name
    cells = json.loads(LESSONS[part - 1].read_text())["cells"]
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for name, reader in PAGE_RUNS[part - 1].items():
        assert (paths.REPO_ROOT / L.lab_file(name, gpu)).is_file(), name
        assert reader in code, (name, reader)
    assert "lesson.load()" in code and "lesson.cards()" in code  # the benchmark, on every card
    assert all(Path(r.path).is_file() for r in L.cards().values())
    text = ["".join(c["source"]) for c in cells]
    at = [i for i, t in enumerate(text) if t.startswith(CLOSING)]
    reading = next(i for i, t in enumerate(text) if t.startswith("## Further reading"))
    assert len(at) == 1 and at[0] < reading
    runs = cells[at[0] + 1]
    assert "hide-output" in runs["metadata"]["tags"] and "lesson.caption(results)" in text[at[0] + 1]
    listed = [p for p in _literal_text(text[at[0] + 1]) if p.startswith("* ") or "\n* " in p]
    assert listed and "benchmark on the H100" in "".join(_literal_text(text[at[0] + 1]))
    for i, c in enumerate(cells):
        source = "".join(c["source"])
        prose = [source] if c["cell_type"] == "markdown" else _literal_text(source)
        assert not any(RESULT_PATH.search(p.replace("config.json", "")) for p in prose), (i, prose)
        assert "lab_file(" not in source and "bench_file(" not in source, i


def test_the_notes_under_tables_say_where_their_numbers_come_from_without_a_path_or_a_date(results):
    """A table read from a lab run says so in plain words under it (a run of its own on the same card, what it
    times); no path, no file name, no date: the page lists the files once, at its end."""
    from book.ternary import results as tables

    gpu = results.path.parent.name
    assert L.provenance(results, 1) == ""
    notes = []
    layers = L.lab_or_none("ternary", L.LAYER_RUN, gpu)
    if layers is not None:
        notes.append(L.amdahl_layers_table(results).splitlines()[-1])
    run = tables.bitnet_results(results)
    if run is not None:
        notes.append(L.provenance(results, 2, run.data))
    for note in notes:
        assert not RESULT_PATH.search(note), note
        assert "further run" not in note and not re.search(r"20\d\d-\d\d-\d\d", note), note
    one, two = (json.loads(p.read_text())["cells"] for p in LESSONS)
    code = lambda cells: "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")  # noqa: E731
    assert "lesson.provenance(" not in code(one) and code(two).count("lesson.provenance(") == 1


def test_the_peers_table_gives_the_binding_floor(results):
    """The peers table's floor is the larger of the 2-bit bytes at the copy bandwidth and the card's latency floor
    (an empty kernel), as every page's floor is."""
    from book.common import latency_floor_ms

    table = L.result_table(results, cases=((L.MAIN, 1), ("2560x2560", 1)))
    empty = latency_floor_ms(results) * 1e3
    for shape in (L.MAIN, "2560x2560"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {shape.replace('x', ' × ')}, 1 |"))
        assert row.strip(" |").split(" | ")[-1] == f"{max(L.floor_us(results, shape), empty):.1f}"


def test_bitnets_host_times_come_from_its_run(results):
    from book.ternary import results as tables

    run = tables.bitnet_results(results)
    if run is None:
        pytest.skip("no committed run with BitNet's kernel")
    data = run.data
    host = tables.bitnet_host(run)
    raw = {(r["series"], r["params"]["shape"]): r for r in data["measurements"]
           if r["params"].get("m") == 1 and r.get("clock", "gpu") == "gpu"}
    assert len(host["rows"]) == len(tables.bitnet_table(run)["rows"])
    for shape, bitnet_host, bitnet_ms, ours_host, ours_ms, series in host["rows"]:
        assert bitnet_host == raw[(T.results.BITNET, shape)]["host_ms"]
        assert ours_host == raw[(series, shape)]["host_ms"] and ours_ms == raw[(series, shape)]["ms"]
    assert host["bitnet"] == (min(r[1] for r in host["rows"]), max(r[1] for r in host["rows"]))
    import statistics

    # the page quotes medians, and the widest spread of ours at one shape, so a range over shapes is not read as
    # a property of the shapes
    assert host["medians"] == (statistics.median(r[1] for r in host["rows"]),
                               statistics.median(r[3] for r in host["rows"]))
    shape, lo, hi = host["noisiest"]
    spreads = {s: raw[(series, s)]["host_spread_ms"] for s, *_, series in host["rows"]}
    assert (lo, hi) == (spreads[shape][0], spreads[shape][2])
    assert all(hi - lo >= v[2] - v[0] for v in spreads.values())
    assert 0 <= host["slower_eager"] <= len(host["rows"])


# ------------------------------------------------------------------------------------------------
# The pages' prose: no format field left as text
# ------------------------------------------------------------------------------------------------

#: A format field as it would reach the page from a string that was not an f-string: ``{name}``, ``{name[4]}``,
#: ``{name:.1f}`` (the same pattern tests/test_site.py looks for on the built page).
FIELD = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?(:[^}]*)?\}")


def _literal_text(code: str) -> list[str]:
    """The literal pieces of every string a ``say(...)`` or ``Markdown(...)`` call of a code cell is given,
    however it is built (concatenated, or an f-string's text between its fields)."""
    import ast

    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("say", "Markdown"):
            for arg in node.args:
                for piece in ast.walk(arg):
                    if isinstance(piece, ast.Constant) and isinstance(piece.value, str):
                        out.append(piece.value)
    return out


def test_the_field_pattern_finds_an_uninterpolated_string():
    found = _literal_text('say("a ({tried[4]}) b " f"c {tried[5]}")\nsay("x" + "{n:.1f} µs")\nsay(f"{n} and {{n}}")')
    assert [m.group(0) for s in found for m in FIELD.finditer(s)] == ["{tried[4]}", "{n:.1f}", "{n}"]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_format_field_is_left_in_a_lessons_prose(path):
    """A string meant as an f-string but written without its ``f`` shows ``{tried[4]}`` to the reader."""
    cells = json.loads(path.read_text())["cells"]
    left = [(i, m.group(0)) for i, c in enumerate(cells) if c["cell_type"] == "code"
            for text in _literal_text("".join(c["source"])) for m in FIELD.finditer(text)]
    assert not left, f"{path.name}: format fields in plain strings (cell, field): {left}"


def test_gemlites_check_names_its_tolerance_and_partial_sums(results):
    from studylog.ternary.peers import BF16_NORM_TOLERANCE

    gem = L.gemlite_check(results)
    if gem is None:
        pytest.skip("no GemLite check in the committed file")
    assert gem["tolerance"] == BF16_NORM_TOLERANCE
    assert gem["passed"] == (gem["error"] <= gem["tolerance"]) and gem["worst"] >= gem["error"]
    assert (L.MAIN in gem["failed"]) != gem["passed"]
    config = L.gpu_row(results, T.results.GEMLITE, L.MAIN)["config"]
    block_k = int(re.search(r"BLOCK_SIZE_K: (\d+)", config)[1])
    assert gem["partials"] * 2 * block_k >= 14336 > (gem["partials"] - 1) * 2 * block_k


def test_the_result_table_marks_the_w2a8_columns_as_other_numerics(results):
    head = L.result_table(results, cases=((L.MAIN, 1),)).splitlines()[0].split("|")
    marked = [cell for cell in head if "(x rounded to int8 first)" in cell]
    assert len(marked) == 2 and all("W2A8" in c or "W8A8" in c for c in marked)
    same = [cell for cell in head if "(same product as cuBLAS)" in cell]
    assert len(same) == 2 and all("bf16 x" in c for c in same)


def test_part_2s_prose_is_within_the_budget():
    from book.common import PROSE_BUDGET, prose_words

    assert prose_words(LESSONS[1]) <= PROSE_BUDGET


# ------------------------------------------------------------------------------------------------
# One ratio a column, and a peer's failed check shown where its time is
# ------------------------------------------------------------------------------------------------

def _failed_gemlite_cases(path):
    """(shape, M) of each failed float64 check of GemLite's output, read from the raw file."""
    data = json.loads(path.read_text())
    return {(c["params"]["shape"], c["params"].get("m")) for c in data["checks"]
            if c["name"].startswith(T.results.GEMLITE + " ") and not c["passed"]}


def test_the_peers_figure_marks_exactly_the_gemlite_bars_that_fail_their_check(results):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from book.ternary.figures import FAILED_EDGE, FAILED_NOTE, _short
    from book.ternary.results import shapes_in
    from studylog.ternary.results import on_gpu_clock

    failed = _failed_gemlite_cases(results.path)
    figs = figures(results)
    ax = next(a for a in figs["peers"].axes if a.get_title().endswith("M = 1"))
    bars = next(c for c in ax.containers if c.get_label() == _short(T.results.GEMLITE))
    view = on_gpu_clock(results)  # the shapes of the panel's groups, as figures() picks them
    timed = [s for s in shapes_in(view) if any(view.select(p, shape=s, m=1) for p in (T.results.GEMLITE, T.results.INT_MM))]
    # where GemLite's output fails its check it gets no ratio, so no bar: its bar there is empty (NaN), and only there
    drawn = dict(zip(timed, bars.patches))
    run = {s for s in timed if view.select(T.results.GEMLITE, shape=s, m=1)}  # GemLite timed there
    marked = {shape for shape, bar in drawn.items() if shape in run and bar.get_height() != bar.get_height()}
    assert marked == {shape for shape, m in failed if m in (1, None)} and marked
    assert not any(bar.get_hatch() for c in ax.containers if hasattr(c, "patches") for bar in c.patches)
    assert all(t.get_color() == FAILED_EDGE for t in ax.texts if "fails" in t.get_text())
    # one note a failing shape, naming the peer, above its whole group of bars (clear of every bar's top)
    notes = [t for t in ax.texts if t.get_text() == FAILED_NOTE.format(peer="GemLite")]
    assert len(notes) == len(marked)
    bars_of = [bar for c in ax.containers if hasattr(c, "patches") for bar in c.patches]
    for note in notes:
        group = [bar.get_height() for bar in bars_of if abs(bar.get_x() + bar.get_width() / 2 - note.xy[0]) < 0.5]
        assert note.xy[1] >= max(h for h in group if h == h) and note.get_va() == "bottom"
    assert max(note.xy[1] for note in notes) < ax.get_ylim()[1]
    for fig in figs.values():
        plt.close(fig)


def test_the_result_table_marks_a_peers_time_where_its_check_failed(results):
    import copy

    table = L.result_table(results, cases=((L.MAIN, 1), ("2560x2560", 1)))
    failed = _failed_gemlite_cases(results.path)
    for shape in (L.MAIN, "2560x2560"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {shape.replace('x', ' × ')}, 1 |"))
        gemlite, int_mm = row.strip(" |").split(" | ")[3], row.strip(" |").split(" | ")[5]
        assert gemlite.endswith(L.FAILS) == ((shape, 1) in failed)
        assert not int_mm.endswith(L.FAILS)
    assert (L.FAILS_NOTE in table) == any((s, 1) in failed for s in (L.MAIN, "2560x2560"))
    # a planted failure of the other peer's check is marked in its own cell only
    planted = copy.copy(results)
    planted.data = copy.deepcopy(results.data)
    planted.data["checks"] = [c for c in planted.data["checks"] if not c["name"].startswith(T.results.GEMLITE)]
    planted.data["checks"].append({"name": f"{T.results.INT_MM} within int8 rounding", "passed": False,
                                   "params": {"shape": "2560x2560", "m": 1}})
    planted.data["measurements"] = [dict(r, role="peer") if r["series"] == T.results.INT_MM else r
                                    for r in planted.data["measurements"]]
    row = next(line for line in L.result_table(planted, cases=(("2560x2560", 1),)).splitlines()
               if line.startswith("| 2560 × 2560, 1 |")).strip(" |").split(" | ")
    assert row[5].endswith(L.FAILS) and not row[3].endswith(L.FAILS)


def test_bitnets_table_counts_its_checks_from_the_file(results):
    from book.ternary import results as tables

    run = tables.bitnet_results(results)
    if run is None:
        pytest.skip("no committed run with BitNet's kernel")
    data = run.data
    table = tables.bitnet_table(run)
    raw = [c for c in data["checks"] if c["name"].startswith(T.results.BITNET + " ")]
    assert (table["checks"], table["passed"]) == (len(raw), sum(c["passed"] for c in raw))
    ratios = [peer / ours for _, peer, ours, _, _ in table["rows"]]
    assert (table["worst"], table["best"]) == (min(ratios), max(ratios))


def test_the_steps_figure_draws_times_from_zero_and_crosses_out_failed_peer_times(results):
    """Part 1's steps figure (also the landing page's teaser): linear axes that start at 0, one panel a Llama shape,
    and GemLite's time drawn as a red cross exactly where its output fails our float64 check at one row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from book.ternary.figures import FAILED_EDGE, FAILED_MARKER

    failed = {shape for shape, m in _failed_gemlite_cases(results.path) if m in (1, None)}
    figs = figures(results)
    panels = [ax for ax in figs["steps"].axes if ax.get_title()]
    assert panels
    red = matplotlib.colors.to_rgba(FAILED_EDGE)
    for ax in panels:
        assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
        crosses = [line for line in ax.get_lines() if line.get_marker() == FAILED_MARKER
                   and matplotlib.colors.to_rgba(line.get_color()) == red]
        assert len(crosses) == (ax.get_title().replace(" × ", "x") in failed), ax.get_title()
    labels = [t.get_text() for legend in figs["steps"].legends for t in legend.get_texts()]
    assert any("fails our float64 check" in t for t in labels) == bool(
        failed & {ax.get_title().replace(" × ", "x") for ax in panels})
    for fig in figs.values():
        plt.close(fig)


def test_part_1s_open_table_gives_16_rows_beside_one(results):
    """Part 1's one open table: each step's one-row time, and beside it its time and × previous at 16 rows where the
    benchmark times it there, "–" for the one-row kernels."""
    table = L.boehm_table(results, L.PART1_ROWS, rows_of_x=1, beside=16)
    assert "| step | the change | µs, M = 16 | × previous, M = 16 | µs, M = 1 | × previous | × the 2-bit floor |" in table
    sixteen = {n: p for n, m, p, _ in L.PART1_ROWS if m == 16}
    lines = [line for line in table.splitlines() if ROW.match(line)]
    assert [int(ROW.match(line)[1]) for line in lines] == list(range(1, 15))
    for line in lines:
        number = int(ROW.match(line)[1])
        cells = [c.strip() for c in line.strip("|").split("|")]
        if number not in sixteen:
            assert cells[2:4] == ["–", "–"], line
            continue
        t = round(L.us(results, T.SERIES[number], L.MAIN, 16), 2)  # as printed, two decimals
        assert cells[2] == f"{t:.2f}", line
        if sixteen[number] is not None:
            before = round(L.us(results, T.SERIES[sixteen[number]], L.MAIN, 16), 2)
            assert cells[3] == f"{before / t:.2f}× (vs {sixteen[number]}{'; tie' if L.is_tie(before / t) else ''})", line


def test_part_1s_steps_table_shows_every_step_at_one_row(results):
    """Steps 6 and 8 to 14 are built for several rows of x, but every step is timed at one row too: the one-row
    table has all fourteen, the 16-row table those eight."""
    assert [n for n, m, _, _ in L.PART1_ROWS if m == 1] == list(range(1, 15))
    assert [n for n, m, _, _ in L.PART1_ROWS if m == 16] == [6, 8, 9, 10, 11, 12, 13, 14]
    table = L.boehm_table(results, L.PART1_ROWS)
    assert "pending" not in table


def test_gemlites_table_gives_its_time_everywhere_and_a_ratio_only_where_it_passes(results):
    """A row a shape of GemLite's check: where it passes, GemLite's time over ours, in order; where it fails, its
    time as measured and, instead of a ratio, ✗ with its error against the tolerance."""
    gem = L.gemlite_check(results)
    if gem is None:
        pytest.skip("no GemLite check in the committed file")
    from studylog.ternary.results import GEMLITE

    rows = _chain_rows(L.gemlite_table(results))
    passing = [r for r in rows if not r[3].startswith(L.FAILS)]
    failing = [r for r in rows if r[3].startswith(L.FAILS)]
    assert sorted(r[0] for r in passing) == sorted(L.shape_words(s) for s in gem["passed_at"])
    assert [r[0] for r in failing] == [L.shape_words(s) for s in gem["failed"]] and failing
    assert not set(gem["failed"]) & set(gem["passed_at"])
    ratios = [float(r[3].rstrip("×")) for r in passing]
    assert ratios == sorted(ratios)
    for shape_, gemlite, ours, ratio in passing:  # the ratio of the two times the row prints
        assert ratio == f"{float(gemlite) / float(ours):.2f}×", shape_
    for shape_, gemlite, ours, cell in failing:
        shape = next(s for s in gem["failed"] if L.shape_words(s) == shape_)
        assert float(gemlite) == round(L.us(results, GEMLITE, shape, 1), 2)
        if shape == L.MAIN:
            assert f"{gem['error']:.2%}" in cell and f"{gem['tolerance']:.2%} allowed" in cell
    code = "".join("".join(c["source"]) for c in json.loads(LESSONS[0].read_text())["cells"])
    assert "lesson.gemlite_table(results)" in code and 'gem["failed"]' in code and "gem['tolerance']" in code


def test_bitnets_table_gives_our_time_beside_its_own(results):
    from book.ternary import results as tables

    run = tables.bitnet_results(results)
    if run is None:
        pytest.skip("no committed run with BitNet's kernel")
    table = tables.bitnet_table(run)
    head, _, *lines = table["table"].splitlines()
    assert "| ours, step 23 (µs) |" in head
    for line, (_, peer, ours, _, _) in zip(lines, table["rows"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[1]) == round(peer * 1e3, 1) and float(cells[2]) == round(ours * 1e3, 1)


def test_the_and_list_reads_as_words():
    assert [L.and_list(x) for x in ([], ["a"], ["a", "b"], ["a", "b", "c"])] == ["", "a", "a and b", "a, b and c"]


def test_the_verdict_says_where_a_step_pays_and_where_it_loses(monkeypatch):
    """A step's sentence says, computed, where it pays over the step it builds on and where it loses (× previous
    rounded to two places against 1.00), and nothing where a time is missing."""
    times = {(T.SERIES[11], L.MAIN, 16): 10.0, (T.SERIES[10], L.MAIN, 16): 12.0,
             (T.SERIES[11], L.MAIN, 1): 13.0, (T.SERIES[10], L.MAIN, 1): 12.0}
    monkeypatch.setattr(L, "us", lambda res, s, shape=L.MAIN, m=1: times.get((s, shape, m)))
    assert L.verdict(None, 11, 10) == "it loses at 4096 × 14336, M = 1 and pays at 4096 × 14336, M = 16"
    times[(T.SERIES[11], L.MAIN, 1)] = 11.0
    assert L.verdict(None, 11, 10) == "it pays at both cases"
    times[(T.SERIES[11], L.MAIN, 1)] = 12.04  # 0.997x rounds to 1.00: not a loss
    assert L.verdict(None, 11, 10) == "it pays at both cases"
    times[(T.SERIES[11], L.MAIN, 16)], times[(T.SERIES[11], L.MAIN, 1)] = 13.0, 14.0
    assert L.verdict(None, 11, 10) == "it loses at both cases"
    del times[(T.SERIES[10], L.MAIN, 1)]
    assert L.verdict(None, 11, 10) == ""


def test_a_step_that_shares_its_kernel_shows_its_one_change():
    """Steps whose kernel is one template (or one Triton kernel) with knobs show it at their knobs, so the diff from
    the step before is the change the step makes, and a change of launch alone shows as the launch."""
    def changed(old, new):
        d = T.CHAPTER.show_diff(old, new)
        return d.added, d.removed

    added, removed = changed(11, 12)
    assert any("rows_in = tl.minimum(rows, N - 1)" in line for line in added)
    added, removed = changed(12, 13)
    assert any("r_k = (r // 32) * 256 + r % 32" in line for line in added)
    added, removed = changed(15, 16)  # the launch alone: K split
    assert all(line.lstrip().startswith("//") for line in added + removed) and any("whole_k=False" in a for a in added)
    added, removed = changed(16, 17)
    assert any("copy_x_slice(" in line for line in added) and any("load_x_group_global" in line for line in removed)
    added, removed = changed(19, 20)
    assert any("ring.fill(c, policy);" in line for line in added) and any("fill_per_warp(" in line for line in removed)
    added, removed = changed(20, 21)
    assert any("group_mma<BF16, MT, RT, true>" in line for line in added)
    added, removed = changed(24, 25)
    assert any("mbarrier_wait(x_full, 0);" in line for line in added) and any("load_xq_slice(" in line for line in removed)


# ------------------------------------------------------------------------------------------------
# What a fresh reader found: the diffs show device code, labels name steps, numbers back the words
# ------------------------------------------------------------------------------------------------

#: For each CUDA C++ step whose change is a flag (a knob, or a choice of its launch): lines of device code its diff
#: must add and remove, the code the flag turns on and off.
DEVICE_CHANGES = {
    16: (("finish_split(arrivals", "(int)blockIdx.y"), ()),
    19: (("z[(size_t)m * N + n] = sum / scale",), ("finish_split(arrivals", "partials[((size_t)blockIdx.y")),
    20: (("bulk_copy(stages + s * stage_pieces", "ring.fill(c, policy);"), ("fill_per_warp(",)),
    21: (("lop3.b32", "decode_pair_reg<BF16>(word, p, magic)"), ("with_magic<BF16>(part(a[r][h], i))",)),
    23: (("mbarrier_wait(x_full, 0);", "quantize(StagedRow{"), ("load_xq_slice(",)),
    25: (("} else if (lane == 1) {", "bulk_copy(xs + r * xs_stride,"), ("load_xq_slice(",)),  # its line broken to fit
}


@pytest.mark.parametrize("step", sorted(DEVICE_CHANGES))
def test_a_flag_steps_diff_shows_the_device_code_it_turns_on(step):
    """Steps 16 to 25 that flip a flag show the kernel with the flag resolved, diffed against the step before: the
    code it turns on and off is in the diff, and no Python launcher (no `// def` lines)."""
    added, removed = DEVICE_CHANGES[step]
    for diff in (L.device_diff(step), L.device_diff(step, region=L.DEVICE_CORE.get(step))):
        text = str(diff)
        assert "// def " not in text and "its launch (Python)" not in text and " false && " not in text
    diff = L.device_diff(step)
    assert all(any(a in line for line in diff.added) for a in added), [a for a in added if not any(a in x for x in diff.added)]
    assert all(any(r in line for line in diff.removed) for r in removed), step


def test_every_cuda_diff_on_part_2_is_device_code():
    """Part 2 shows no diff of a step's text with its Python launcher: every diff is of device code."""
    code = "".join("".join(c["source"]) for c in json.loads(LESSONS[1].read_text())["cells"] if c["cell_type"] == "code")
    assert "CHAPTER.show_diff(" not in code and "def show(step" in code
    for step in range(16, 26):
        assert "// def " not in str(L.device_diff(step, helpers=step != 22))




def test_step_11_and_13_say_one_thing_about_step_11():
    """Steps 10 to 12 each have a heading, a number (over the step before, at 16 rows and one row, a tie marked
    with why the step is kept) and step 11 its core's diff, step 12 its whole diff, both open; step 13 no longer
    says that step 11 does not pay."""
    nb = json.loads(LESSONS[0].read_text())["cells"]
    cells = {c["id"]: "".join(c["source"]) for c in nb}
    assert cells["984fc1d0"].startswith("## Step 10: configs made for the tensor cores")
    assert cells["step11-heading"].startswith("## Step 11: ") and cells["step12-heading"].startswith("## Step 12: ")
    assert "def gain(n, b, why)" in cells["step10-number"] and "gain(10, 6," in cells["step10-number"]
    assert "core(11)" in cells["95bad76e"] and "gain(11, 10," in cells["95bad76e"]
    assert "show(11, 12)" in cells["f75f917b"] and "gain(12, 11," in cells["f75f917b"]
    shown = [c for c in nb if c["id"] in ("95bad76e", "f75f917b")]
    assert all("hide-output" not in c["metadata"]["tags"] for c in shown)
    assert changed_lines(L.triton_core(11)) <= 40 and changed_lines(L.kernel_diff(11, 12)) <= 40
    assert changed_lines(L.kernel_diff(5, 6)) <= 40
    assert "does not pay alone" not in cells["46a9996e"]


def test_part_1s_figure_names_the_steps_it_shows(results):
    """The steps figure shows the Triton steps timed at every Llama shape, and steps 4 and 13 in the panel where
    they are timed; it says which steps are drawn at one shape only and which are left out, labels each row "step N:
    what it is", and writes each value right of its whisker (clear of the range bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figures(results)["steps"]
    title = fig._suptitle.get_text()
    assert "timed at every Llama shape" in title and "steps 10 to 12: only in the steps table" in title
    assert "steps 4 and 13: timed at 4096 × 14336 only" in title
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert any(label.startswith("step 13: ") for label in labels) and any(label.startswith("step 4: ") for label in labels)
    values = [t for t in fig.axes[0].texts if re.fullmatch(r"\d+\.\d", t.get_text())]
    assert values and all(t.get_ha() == "left" and t.get_va() == "center" and t.xyann[0] > 0 for t in values)
    for ax in fig.axes[:3]:  # each value is anchored at the right end of its dot's range
        for t in (t for t in ax.texts if re.fullmatch(r"\d+\.\d", t.get_text())):
            ends = [line.get_xdata()[-1] for line in ax.lines if len(line.get_xdata()) == 2
                    and line.get_ydata()[0] == t.xy[1] and line.get_linestyle() == "-"]
            assert not ends or t.xy[0] >= max(ends) - 1e-9, t.get_text()
    steps = [label for label in labels if label.startswith("step")]
    assert steps and all(re.fullmatch(r"step \d+: .+", label) for label in steps), labels
    assert not any(re.search(r"step\d\d_", label) for label in labels)
    plt.close("all")


def test_tables_name_steps_by_number_and_what_they_are(results):
    """The peers and prefill tables say "step N: ..." where they name our kernel, never `stepNN_slug`."""
    from book.ternary import results as tables

    for text in (L.result_table(results, w2a8=(T.SERIES[23], T.SERIES[25])), tables.prefill(results)["table"],
                 tables.prefill(results, series=(T.SERIES[14],))["table"]):
        assert not re.search(r"step\d\d_", text), text
        assert re.search(r"step \d+: ", text)


def test_part_2_gives_each_step_its_heading_and_one_number(results):
    """Steps 15 to 23 have headings in order, one a step and one each for step 22's parts (22a, 22b, 22c; no heading
    covers two steps), and each section shows its diff or new code and quotes one bold number: a step's time from
    the benchmark the steps table reads over the step before it, a part's from the run that times step 22 in parts.
    Steps 24 and 25, tried for several rows, each have a "tried" heading after step 23: one bold number each (at 16
    rows, over the step before), their diffs folded. No section shows a table of two steps' times."""
    cells = json.loads(LESSONS[1].read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    heads = [(i, m[1] + m[2]) for i, t in enumerate(text) if (m := re.match(r"#+ Step (\d+)([a-c]?):", t))]
    assert [n for _, n in heads] == ["15", "16", "17", "18", "19", "20", "21", "22a", "22b", "22c", "23"]
    assert not any(re.match(r"#+ Steps \d+ and", t) for t in text)
    assert all(text[i].startswith("## ") for i, _ in heads)
    tried = next(i for i, t in enumerate(text) if t.startswith("## Step 24, tried: "))
    tried25 = next(i for i, t in enumerate(text) if t.startswith("## Step 25, tried: "))
    assert heads[-1][0] < tried < tried25
    assert not any(t.startswith("## Tried") for t in text)
    code = "".join(t for c, t in zip(cells, text) if c["cell_type"] == "code")
    assert "pair_chain(" not in code and "case_ratios(" not in code
    steps = next(i for i, t in enumerate(text) if t.startswith("## The steps"))
    ends = [i for i, _ in heads[1:]] + [tried]
    shows = ("show(", "core_diff(", "excerpt(", "group_mma_listing(", "w2a8_group_diff(", "show_source(", "_listing(")
    for (at, n), end in zip(heads, ends):
        section = "".join(t for c, t in zip(cells[at:end], text[at:end]) if c["cell_type"] == "code")
        assert any(s in section for s in shows), n
        if not n.isdigit():
            assert section.count(f"Step {n} takes **") == 1, n
            continue
        bold = re.findall(r"Step (\d+) takes \*\*\{t2\(us\((\d+)\)\)\}\*\*, "
                          r"\{x\(us\((\d+)\), us\((\d+)\)\)\} step (\d+)'s speed", section)
        assert len(bold) == 1, (n, bold)
        said, timed, before, after, named = bold[0]
        assert int(said) == int(timed) == int(after) == int(n) and int(before) == int(named) == int(n) - 1, (n, bold)
    for n, (start, end) in ((24, (tried, tried25)), (25, (tried25, steps))):
        section = list(zip(cells[start + 1:end], text[start + 1:end]))
        said = "".join(t for c, t in section if c["cell_type"] == "code" and "hide-output" not in c["metadata"]["tags"])
        assert said.count("**") == 2 and f"At 16 rows step {n} takes **{{t2(us({n}, m=16))}}**, " \
            f"{{x(us({n - 1}, m=16), us({n}, m=16))}} step {n - 1}'s speed" in said, n
        folded = "".join(t for c, t in section if c["cell_type"] == "code" and "hide-output" in c["metadata"]["tags"])
        assert ("lesson.core_diff(24)" if n == 24 else "show(25)") in folded
        assert "core_diff(" not in said and "show(" not in said


def test_steps_22_and_23_list_their_changes_and_what_is_timed_apart(results):
    """Step 22's parts each have a section: 22a its one idea (the int8 MMA, its decode and sums, which run only
    together), 22b the kernel that quantises x, each with its number from the run that times step 22 in parts (its
    table open under 22c, beside that run's own step 21; the steps table holds only the benchmark's times, step 22
    whole, and says once where 22a and 22b are), 22c the early launch, step 22 whole: the benchmark's step
    22 over step 21, and the share of the quantising the early launch hides, from the run in parts. Step 23 says
    where it quantises x, the places folded."""
    nb = json.loads(LESSONS[1].read_text())["cells"]
    cells = {c["id"]: "".join(c["source"]) for c in nb}
    assert "are one change (the diff below)" in cells["c05f0206"] and ":::{dropdown}" not in cells["c05f0206"]
    assert 'load_lab("ternary", "step22_parts")' in cells["step22-gain"]
    assert "ALONE in parts" in cells["step22-gain"]  # 22a measured by itself where the run has it, else derived
    # each part its number, from the run of its own, over the part before; the steps table gives each its row
    assert "Step 22a takes **{one[matmul]:.2f} µs**, {run[matmul]:.2f}× step 21's speed" in cells["a586196e"]
    # why the MMA, its decode and its sums are one change: none runs without the others
    assert "the int8 MMA needs the one-AND decode" in cells["c05f0206"]
    assert "{x(one[matmul], one[after])} 22a's speed" in cells["step22b-number"]
    assert "Step 22c takes **{t2(us(22))}**, {x(us(21), us(22))} step 21's speed" in cells["step22c-number"]
    assert "(one[after] - one[early]) / one[\"quantize_x\"]" in cells["step22c-number"]
    assert "kept for step 23" in cells["step22c-number"] and "in the benchmark" not in cells["step22c-number"]
    assert not any(f"| 22{p} |" in cells["74d3fbc1"] for p in "abc") and "†" not in cells["74d3fbc1"]  # one run
    assert "timed in step 22's run in parts" in cells["74d3fbc1"] and "timed apart" not in cells["74d3fbc1"]
    # that run's own step 21 is a row of the parts table (22a's × step 21 divides it); 22c's time in that run said
    # once, in the parts table's own caption, beside the benchmark's (one number per thing, the run named)
    assert "one['step 21']" not in cells["74d3fbc1"] and "one[early]" not in cells["74d3fbc1"]
    assert "from a separate run" in cells["step22-parts"] and "differ by up to" not in cells["step22-parts"]
    assert "(its step 22c: {t2(one[early])}; the steps table's: \"\n                 f\"{t2(us(22))})" in cells["step22-parts"]
    assert "run of its own" not in cells["a586196e"]  # the legend says it once, not the prose
    assert "say(" not in cells["step22-gain"]  # 22a's number once, in the chain
    assert "one['step 21']" not in cells["a586196e"]  # step 21's time is the benchmark's, on the page once
    parts = next(c for c in nb if c["id"] == "step22-parts")
    assert "hide-output" not in parts["metadata"]["tags"] and "display(Markdown(" in cells["step22-parts"]
    assert "above 8 rows the place is step 22" in cells["07088276"]
    assert "Rounding to int8 is now on every block's critical path" in cells["07088276"]
    assert L.place_us(results, "staged") == L.us(results, T.SERIES[23])  # the default at one row
    assert L.place_us(results, "separate") == L.us(results, T.SERIES[22])
    # the parts' run: its checks passed, every part at every case, and the parts add up as the page says
    from studylog.plotting import load_lab

    parts = load_lab("ternary", "step22_parts")
    assert parts["checks"] and all(c["passed"] for c in parts["checks"])
    one = {r["params"]["variant"]: r["ms"] for r in parts["measurements"]
           if (r["params"]["n"], r["params"]["k"], r["params"]["m"]) == (4096, 14336, 1)}
    alone = "step 22's matmul alone (x given as int8)"  # 22a, timed by itself
    assert set(one) == {"step 21", alone, "quantize_x", "step 22, launched after", "step 22"}
    assert one["quantize_x"] < one["step 22"] < one["step 22, launched after"]  # early launch hides part of it
    assert one[alone] < one["step 21"]  # the int8 matmul alone beats step 21
    assert one[alone] < one["step 22, launched after"]  # the separate quantising kernel costs time


def test_part_2_says_why_step_23s_default_is_what_it_is(results):
    """Staged x for a long row: on the Llama shapes (long rows) the default stages x, the faster place or a tie; the
    page says the rule, why a short row is quantised in every block, and reads the threshold from the library."""
    times = L.place_times(results, [L.MAIN, L.BIG])
    assert all(r["default"] == "staged" and (r["gain"] < 1 or L.is_tie(r["gain"])) for r in times.values())
    code = "".join("".join(c["source"]) for c in json.loads(LESSONS[1].read_text())["cells"])
    assert "{W2A8_STAGED_MIN_K:,} or more" in code and "which a short row does not repay" in code


def test_the_per_layer_table_is_part_1s_alone():
    """Part 1 shows the table of BitNet b1.58 2B4T's layers; part 2 links to it and gives only its new totals."""
    one, two = ("".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"]) for p in LESSONS)
    assert "lesson.amdahl_layers_table(" in one and "lesson.amdahl_layers_table(" not in two
    assert "05_ternary_1_triton.ipynb#why-it-matters" in two


def test_part_2_claims_nothing_about_the_void_captures():
    """The `(void)` captures of step 23's closure are in its source; the page makes no claim about them it does
    not measure."""
    two = "".join("".join(c["source"]) for c in json.loads(LESSONS[1].read_text())["cells"])
    assert "(void)" not in two and "ptxas" not in two


def test_part_1_says_where_steps_10_to_14_pay_and_leads_with_the_shapes_gemlite_passes(results):
    """Steps 10 to 14 add little alone: a table gives each one's × previous at every case it is timed, and the page
    quotes it; the GemLite headline gives the range where GemLite's output passes our check, names the shapes where
    it fails with the ratio where GemLite is the faster (a loss stays in the headline), and says why the bound is
    four bf16 roundings."""
    table = L.pays_table(results)
    rows = [line for line in table.splitlines() if re.match(r"^\| 1[0-4] \|", line)]
    assert [r.split(" | ")[0] for r in rows] == [f"| {n}" for n in (10, 11, 12, 13, 14)]
    f13 = round(L.us(results, T.SERIES[12]), 2) / round(L.us(results, T.SERIES[13]), 2)  # as the steps table prints
    assert f"{f13:.2f}×" in rows[3]
    assert L.pays_words(results).startswith("step 13 pays at every case")
    code = "".join("".join(c["source"]) for c in json.loads(LESSONS[0].read_text())["cells"])
    assert "lesson.pays_table(results)" in code and "lesson.pays_words(results)" in code
    assert "at the {len(passing)} shapes where \"\n        f\"GemLite's output passes our float64 check**" in code
    # the shapes where GemLite's output fails are named, each with its ratio where GemLite is the faster
    assert "part1.gemlite_split(" in code and 'fails = {f["shape"]: f for f in vs_gem["failed"]}' in code
    assert "if f[\"faster\"]" in code and "at all {len(every)}" not in code
    assert "room for a few roundings, not for an error that grows with K" in code


def test_the_whole_step_against_gemlite_sums_the_layers_both_ran(results):
    """Part 1 prices the decode step against GemLite as well as cuBLAS: over the layers the benchmark times for both
    (k and v are not, and are named with their share of the weights), the ratio of the count-weighted sums, and the
    whole step by Amdahl's law on the layers' share of a step's time; the shape where GemLite fails its check is
    named."""
    from studylog.ternary.results import CUBLAS, GEMLITE

    peer = L.amdahl_peer(results, T.SERIES[14], GEMLITE)
    if peer is None:
        pytest.skip("no GemLite times at the model's shapes")
    kept = [(name, f"{n}x{k}", c) for name, n, k, c, _ in L.BITNET_LAYERS if name in peer["layers"]]
    assert peer["missing"] == [name for name, *_ in L.BITNET_LAYERS if name not in peer["layers"]]
    theirs = sum(c * L.us(results, GEMLITE, s) for _, s, c in kept)
    ours = sum(c * L.us(results, T.SERIES[14], s) for _, s, c in kept)
    base = sum(c * L.us(results, CUBLAS, s) for _, s, c in kept)
    assert peer["speedup"] == pytest.approx(theirs / ours, rel=1e-12)
    share = L.amdahl(results, [T.SERIES[14]])["time_share"]
    step = lambda speed: (1 - share) + share / speed  # noqa: E731
    assert peer["end_to_end"] == pytest.approx(step(base / theirs) / step(base / ours), rel=1e-12)
    assert 1 < peer["end_to_end"] < peer["speedup"]
    assert peer["failed"] == [s for _, s, _ in kept if not L.gemlite_check(results, s)["passed"]]
    cells = {c["id"]: "".join(c["source"]) for c in json.loads(LESSONS[0].read_text())["cells"]}
    why = cells["ff5c35bc"] + cells["why-layers"]  # the open cell, then the fold under it
    assert "lesson.amdahl_peer(results, STEP[14].series, GEMLITE)" in why and "peer['missing_share']" in why
    assert "shapes where GemLite's output passes our float64 check; GemLite fails it at \"" in why
    assert 'f["shape"].replace("x", " × ") for f in vs_gem["failed"]' in why


def test_part_1_says_what_steps_10_to_12_are_for_and_quotes_the_eager_cost_beside_the_result():
    nb = json.loads(LESSONS[0].read_text())["cells"]
    text = ["".join(c["source"]) for c in nb]
    assert "Steps 10 to 12 prepare step 13's layout; alone each ties or gains little" in _sections(LESSONS[0])[10]
    result = next(i for i, t in enumerate(text) if t.startswith("## The result"))
    lose = next(i for i, t in enumerate(text) if t.startswith("## Where we lose"))
    eager = [i for i, t in enumerate(text) if "**Called eagerly**" in t or "Called eagerly, step 14" in t]
    assert len(eager) == 1 and result < eager[0] < lose
    assert "step 13's speed" not in text[lose + 1]  # a loss to our own step belongs to the steps table


def test_part_2_ends_its_story_on_step_23_and_folds_the_tried_path_and_the_tuning():
    """Part 2 prices the decode with step 23 alone; it defines its terms where they first appear, no glossary up
    front (`2bit_tiles` at step 15, the magic constant at step 21, SASS where it is first quoted); steps 24 and 25 each sit under a
    "tried" heading whose number says, from the file, that they lose at 16 rows to part 1's step 14 and at one row to
    step 23; the eager result sits beside the graph's range; the place-of-x table is folded."""
    nb = json.loads(LESSONS[1].read_text())["cells"]
    cells = {c["id"]: c for c in nb}
    text = {i: "".join(c["source"]) for i, c in cells.items()}
    assert ":::" not in text["81fd089c"]
    assert "`2bit_tiles`: part 1's 2-bit words reordered" in text["75c26ba2"]
    assert "magic constant of part 1's step 11 (bits that" in text["36ac457c"]
    assert "In the SASS (the machine code)" in text["d431a826"]
    why = text["5519d543"]
    assert "lesson.amdahl(results, [STEP[23].series])" in why and "lesson.amdahl(results)" not in why
    assert "STEP[21]" not in why
    assert text["b9e91fe2"].startswith("## Step 24, tried: ") and text["step25-heading"].startswith("## Step 25, tried: ")
    assert "us(25, m=16)" in text["tried-25"] and "us(14, m=16)" in text["tried-24-25"]
    assert "us(23))" in text["tried-24-25"]
    assert "eager['medians'][0]" in text["c383ddc8"] and "eager['medians'][0]" not in text["67ad7289"]
    place = next(i for i, t in text.items() if "| N × K | staged | every block |" in t)
    assert "hide-output" in cells[place]["metadata"]["tags"]
    assert "display(" not in text["812e9119"]


def test_the_tried_section_names_where_step_25_wins_and_both_shares_are_given(results):
    """Part 2's step 25 section says step 25 wins at one row at BitNet's largest-N shapes: the file's wins are the
    shapes of largest N among BitNet's. Part 1 gives the ternary layers' share in bf16 and in 2 bits; part 2 opens
    on the same shares in one line, links part 1's table, and gives one estimate open (against BitNet's kernel), the
    layer sum and cuBLAS's folded; part 1's estimates stay on part 1."""
    from book.ternary import results as tables

    run = tables.bitnet_results(results)
    wins = L.step25_wins(run)
    if wins:
        shapes = sorted((s for s, *_ in tables.bitnet_table(run)["rows"]), key=lambda s: -int(s.split("x")[0]))
        assert set(wins) == set(shapes[:len(wins)])
    tried = "".join(next(c for c in json.loads(LESSONS[1].read_text())["cells"] if c["id"] == "step25-heading")["source"])
    assert "largest-N" in tried and "no entry point picks it" in tried
    text = "".join(next(c for c in json.loads(LESSONS[0].read_text())["cells"] if c["id"] == "ff5c35bc")["source"])
    fold = "".join(next(c for c in json.loads(LESSONS[0].read_text())["cells"] if c["id"] == "why-layers")["source"])
    assert "view['share']" in text and "In 2 bits" in fold  # one share open, the other folded
    assert "replaces each ternary layer's cuBLAS time in a decode step by the kernel's" in \
        " ".join(text.replace('"\n    "', "").split())
    cells = {c["id"]: "".join(c["source"]) for c in json.loads(LESSONS[1].read_text())["cells"]}
    why = cells["5519d543"]  # part 2 opens on part 1's share, computed as part 1 does, and links part 1's table
    assert "05_ternary_1_triton.ipynb#why-it-matters-the-linear-layers-of-a-decode-step" in why
    assert "of a decode step's bytes" in why and "view14['share']" in why and "packed to 2 bits" in why
    assert "view['time_share']" in why and "law on bytes" not in why
    # the open paragraph is the shares and one estimate; the layer sum and cuBLAS's estimate in the fold under it,
    # the host times under Where we lose (the estimate says how it is called and links there), part 1's estimates
    # on part 1 only
    assert "peer['end_to_end']" in why and "view['end_to_end']" not in why and "eager[" not in why
    assert "called in a CUDA graph or through `W2A8Plan`" in why and "(#the-result-against-the-peers)" in why
    assert "view['end_to_end']" in cells["why-sums-2"] and "peer['speedup']" in cells["why-sums-2"]
    assert "GEMLITE" not in why + cells["why-sums-2"] and "view14['end_to_end']" not in why + cells["why-sums-2"]


def test_every_steps_table_ratio_is_the_ratio_of_the_times_it_prints(results):
    """× previous in part 2's steps tables (each M) and part 1's (one row and 16 rows beside it) is the ratio of the
    two times the table prints, and its tie mark and part 2's role follow that ratio under the tie rule."""
    from book.common import is_tie
    from book.ternary import part1 as P

    def check(rows, step_col, us_col, vs_col, role_col=None):
        times = {r[step_col]: r[us_col] for r in rows}
        checked = 0
        for r in rows:
            found = re.match(r"([\d.]+)× \(vs (\w+)(; tie)?\)", r[vs_col])
            if not found or times.get(found.group(2), "–") == "–":
                continue
            value, before, tie = found.groups()
            shown = float(times[before].rstrip("†")) / float(r[us_col].rstrip("†"))
            assert value == f"{shown:.2f}", r
            assert bool(tie) == is_tie(shown), r
            if role_col is not None:
                assert r[role_col].startswith("tie") == is_tie(shown), r
            checked += 1
        return checked

    for m in (1, 16):
        table = L.boehm_table(results, L.PART2_ROWS, read_only=True, roles=L.part2_role, rows_of_x=m)
        assert check(_chain_rows(table.split("\n\n", 1)[1]), 0, 3, 4, role_col=1) >= (8 if m == 1 else 1)
    layers = P.bitnet_layers(results)
    rows = tuple(r for r in P.part1_rows(layers) if not r[3].startswith("tried"))
    table = _chain_rows(L.boehm_table(results, rows, rows_of_x=1, beside=16, at=L.BITNET_STEPS).split("\n\n")[1])
    assert check(table, 0, 4, 5) >= 10 and check(table, 0, 2, 3) >= 4
