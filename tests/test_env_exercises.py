"""Chapter 0's exercise 3 (a tail without a mask): the answer in ``book/env/solutions.py`` passes the page's check
through Triton's interpreter (or on a GPU), and the check refuses a version that forgets the tail and the stub."""

import torch

from book.common import NOT_WRITTEN
from book.env import exercises, solutions
from studylog import runtime, tour


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
