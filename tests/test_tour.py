import pytest
import torch

from studylog import runtime, tour


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
