import pytest
import torch

from book.env import tour
from studylog import runtime


@pytest.mark.parametrize("n", [1, 127, 128, 129, 1000])
def test_step1_any_length(n, rng):
    x = torch.randn(n, generator=rng).to(runtime.device())
    y = tour.scale(x, -1.5, step=1)  # output is poisoned with NaN before the launch
    ref = (x.double() * -1.5).float()
    assert not torch.isnan(y).any(), "kernel left elements unwritten"
    torch.testing.assert_close(y, ref, rtol=0, atol=0)


def test_step0_on_a_multiple_of_the_block(rng):
    x = torch.randn(256, generator=rng).to(runtime.device())
    torch.testing.assert_close(tour.scale(x, 2.0, step=0), 2.0 * x, rtol=0, atol=0)


def test_step0_refuses_other_lengths():
    with pytest.raises(ValueError, match="multiple of block"):
        tour.scale(torch.randn(100, device=runtime.device()), 2.0, step=0)


@pytest.mark.parametrize(
    "x, match",
    [
        (torch.randn(8, dtype=torch.float64), "float32"),
        (torch.randn(2, 4), "1-D"),
        (torch.randn(8, 2)[:, 0], "contiguous"),
        ([1.0, 2.0], "torch.Tensor"),
    ],
)
def test_bad_input(x, match):
    with pytest.raises((TypeError, ValueError), match=match):
        tour.scale(x, 1.0)


@pytest.mark.gpu
def test_step1_on_gpu_full_size():
    x = torch.randn(10_000_019, device="cuda")
    torch.testing.assert_close(tour.scale(x, 0.5), 0.5 * x, rtol=0, atol=0)


def test_the_floor_exercise_accepts_the_answer_and_rejects_wrong_ones(capsys):
    """Chapter 0's CPU exercise: the check accepts the answer in ``book/env/solutions.py`` and refuses a floor that
    forgets the logits written, one that forgets the empty kernel, one in the wrong units; the stub is not written."""
    from book.common import NOT_WRITTEN
    from book.env import exercises, solutions

    assert exercises.check_head_floor(solutions.reference_head_floor_us)

    def no_logits(k, bw, e):
        return max(k * 3072 * 2 / (bw * 1e3), e)

    def no_launch(k, bw, e):
        return (k * 3072 * 2 + 128256 * 4) / (bw * 1e3)

    def in_ms(k, bw, e):
        return solutions.reference_head_floor_us(k, bw, e) / 1e3

    for wrong in (no_logits, no_launch, in_ms, lambda k, bw, e: 1 / 0):
        assert not exercises.check_head_floor(wrong)
    assert "differ from the chapter's answer" in capsys.readouterr().out

    def stub(k, bw, e):
        raise NotImplementedError

    assert not exercises.check_head_floor(stub)
    assert NOT_WRITTEN in capsys.readouterr().out


@pytest.mark.parametrize("bandwidth_gbs, empty_kernel_us", [(4243.1, 0.561), (3300.0, 0.9), (100.0, 0.5), (8000.0, 3.0)])
def test_the_floor_exercises_crossover_is_where_the_bytes_take_over(bandwidth_gbs, empty_kernel_us):
    from book.env.solutions import reference_head_floor_us as floor
    from book.env.solutions import reference_rows_where_bytes_set_the_floor as crossover

    k = crossover(bandwidth_gbs, empty_kernel_us)
    assert floor(k, bandwidth_gbs, empty_kernel_us) > empty_kernel_us
    assert k == 0 or floor(k - 1, bandwidth_gbs, empty_kernel_us) == empty_kernel_us


def test_chapter_0_sets_a_gpu_exercise_and_one_a_cpu_checks():
    """The page opens with the two modes and says how it was rendered under the first output that shows the mode,
    keeps "How the numbers are measured" to two bullets and a link, gives its ceilings table a clock column, and sets
    three exercises: the second and third checked on a CPU, with no answer on the page."""
    import json
    import re
    from pathlib import Path

    from book.results import exercise_count

    page = Path(__file__).parents[1] / "notebooks" / "00_how_to_read.ipynb"
    sources = ["".join(c["source"]) for c in json.loads(page.read_text())["cells"]]
    modes = next(i for i, s in enumerate(sources) if s.startswith("## Two ways to run"))
    banner = next(i for i, s in enumerate(sources) if "This page was rendered without a GPU" in s)
    printed = next(i for i, s in enumerate(sources) if "studylog.mode()" in s)
    anatomy = next(i for i, s in enumerate(sources) if s.startswith("## Anatomy of a step"))
    assert modes < printed < banner < anatomy
    measured = next(s for s in sources if s.startswith("## How the numbers are measured"))
    assert len(re.findall(r"^\* ", measured, re.M)) == 2 and "../how_we_measure.md" in measured
    assert any("| clock |" in s for s in sources)
    assert exercise_count(page.relative_to(page.parents[1])) == 3
    start = next(i for i, s in enumerate(sources) if s.startswith("## Exercises"))
    exercises = "\n".join(sources[start:])
    assert "exercises.check_head_floor(head_floor_us)" in exercises and "def head_floor_us(" in exercises
    assert "exercises.check_two_launches(scale_two_launches)" in exercises
    assert not re.search(r"\bsolutions\b(?!\.py)|\breference_\w+", exercises)


def test_chapter_0_says_once_that_it_ran_without_a_gpu_and_why_the_ceilings_use_do_bench():
    """The GPU-less rendering is said once (the banner); before the ceilings table, one line says why the copy's rate
    is the one ``do_bench`` number the floors take; the answers' path is given in the course's one form."""
    import json
    from pathlib import Path

    page = Path(__file__).parents[1] / "notebooks" / "00_how_to_read.ipynb"
    cells = json.loads(page.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    assert sum("rendered without a gpu" in s.lower() for s in sources) == 1
    measured = next(i for i, s in enumerate(sources) if s.startswith("## How the numbers are measured"))
    table = next(i for i, s in enumerate(sources) if "| measurement | size | clock |" in s)
    assert measured < table and "a launch cannot move their rate; the\nfloors take that rate" in sources[measured]
    assert "The headlines never use" not in sources[table]
    assert "Answers:\n`book/env/solutions.py` in the repository." in "\n".join(sources)
