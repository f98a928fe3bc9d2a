"""Chapter 0's exercise 3 (a tail without a mask): the answer in ``book/env/solutions.py`` passes the page's check
through Triton's interpreter (or on a GPU), and the check refuses a version that forgets the tail and the stub."""

import torch

from book.common import NOT_WRITTEN
from book.env import exercises, solutions, tour
from studylog import runtime


def test_the_answer_passes_the_check():
    assert exercises.check_two_launches(solutions.scale_two_launches)


def test_the_answer_equals_step_1_at_awkward_lengths(rng):
    for n in (1, 127, 128, 129, 300):
        x = torch.randn(n, generator=rng).to(runtime.device())
        torch.testing.assert_close(solutions.scale_two_launches(x, 0.75), tour.scale(x, 0.75), rtol=0, atol=0)


def test_the_check_refuses_a_forgotten_tail_and_the_stub(capsys):
    def no_tail(x, alpha, block=128):
        y = torch.full_like(x, float("nan"))
        if x.numel() // block:
            tour.scale_step0[(x.numel() // block,)](x, y, alpha, BLOCK=block)
        return y

    assert not exercises.check_two_launches(no_tail)
    assert "never written" in capsys.readouterr().out

    def stub(x, alpha):
        raise NotImplementedError

    assert not exercises.check_two_launches(stub)
    assert NOT_WRITTEN in capsys.readouterr().out


def _page_cells() -> list[dict]:
    import json

    from studylog.paths import REPO_ROOT

    return json.loads((REPO_ROOT / "notebooks" / "00_how_to_read.ipynb").read_text())["cells"]


def test_exercise_1s_measured_answer_is_in_the_solutions_not_on_the_page():
    """The page prints no answer to exercise 1 (no fold, no read of the exercise's run or of chapter 04's steps after
    the Exercises heading); the solutions module gives both, read from the committed runs."""
    import re

    from studylog import plotting

    sources = ["".join(c["source"]) for c in _page_cells()]
    start = next(i for i, s in enumerate(sources) if s.startswith("## Exercises"))
    after = "\n".join(sources[start:])
    assert "dropdown" not in after and "axpy_exercise" not in after and "say(" not in after
    assert "`book/env/solutions.py`" in sources[start]
    assert not any(re.search(r'load_lab\("tour"|load_results\("ctc"', s) for s in sources)
    run = plotting.load_lab("tour", "axpy_exercise", gpu="nvidia-h200")
    said = solutions.axpy_measured()
    for r in run["measurements"]:
        assert f"{r['series']} {r['ms'] * 1e3:,.1f} µs" in said
    assert "cases on the" in solutions.restrict_ldg_in_chapter_04()


def test_a_visible_cell_defines_what_it_reads_and_the_copy_rate_is_said_once_with_its_twin():
    """The floor's visible cell loads the run it reads (``env``) itself; the prose gives the floors' copy rate and names
    the table's 1 GiB row as the same copy timed again; no prose sentence ends in a colon before a paragraph."""
    cells = _page_cells()
    for c in cells:
        src = "".join(c["source"])
        hidden = "remove-input" in c["metadata"].get("tags", [])
        if c["cell_type"] == "code" and not hidden and "env.data" in src:
            assert 'env = plotting.load_results("env")' in src, src[:200]
    rate = next("".join(c["source"]) for c in cells if "{bandwidth_gbs:,.0f} GB/s**" in "".join(c["source"]))
    assert "the table's 1 GiB row, the same copy timed again later in the run, reads {gib['gbs']:,.0f}" in rate
    measured = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("## How the numbers"))
    assert not measured.rstrip().endswith(":")


def test_the_chapters_own_empty_kernel_is_said_before_this_pages_and_exercise_1_holds_no_path():
    """Early, before the card's tables, one sentence says the chapters divide by their own runs' ceilings and gives
    the kernel chapters' empty kernels (read from their committed runs) against this page's; exercise 1's text
    hints at what to find without a repository path (the answers' path is said once, over the exercises), and the
    page names no test plumbing."""
    from book.scoreboard import empty_kernel_ms, read_json
    from studylog import plotting

    cells = _page_cells()
    ids = [c["id"] for c in cells]
    sources = {c["id"]: "".join(c["source"]) for c in cells}
    own = sources["ch0ownfloors"]
    assert ids.index("b837dd29") < ids.index("ch0ownfloors") < ids.index("4f50fce9") < ids.index("01177dca")
    assert "{min(own):.2f} to {max(own):.2f} µs" in own and "This page's run, on another day, timed\n{page_us:.2f}" in own
    from book.results import KERNEL_RUNS

    env = plotting.load_results("env")
    times = [empty_kernel_ms(read_json(env.path.parent / f"{r}.json")) for r in KERNEL_RUNS]
    assert all(t is not None and t > env.data["ceilings"]["empty_launch_gpu_ms"] for t in times)
    first = sources["ch0exercise"].split("**2.")[0]
    exercise_1 = first[first.index("**1."):]
    assert "solutions" not in exercise_1 and "Without a GPU it only\nsays so" in exercise_1
    assert first.index("`book/env/solutions.py`") < first.index("**1.")
    text = "\n".join(sources.values())
    assert "nbval" not in text and ".venv" not in text and "make lab" in sources["2442ecc9"]
