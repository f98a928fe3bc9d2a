"""The first attempt at a ternary kernel in Triton (a notebook's first ternary kernel), rejected: kept beside the
library only to show its bugs. Notebook 05 (part 1, "A first attempt and its bugs") loads this file with
``book.ternary.lesson.first_attempt()`` and runs it on its own example and on a fresh input of awkward size.

Wrong on purpose, and not part of the library: W is (K, N) here, the blocks are 2 x 2, the output is float16, a
modulo stands in for the mask on the outputs, and x's stride is ignored. ``x_along_n=True`` is the earlier version
whose output stayed in its notebook's last cell (x broadcast along N instead of K).

Run from the repository root (CPU through Triton's interpreter, or a GPU): ``PYTHONPATH=$PWD python
lab/ternary/first_attempt.py`` checks that it reproduces both of its outputs on its own example and fails the
float64 reference on a fresh input whose sizes are not multiples of its blocks, where step 1 passes.
"""

import studylog  # noqa: F401  (first: it picks the GPU, or Triton's interpreter on a CPU)
import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def first_attempt_kernel(x_ptr, w_ptr, z_ptr, scale, M, N, stride_xm, stride_wm, stride_wn,
                         BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, X_ALONG_N: tl.constexpr):
    # The first attempt's kernel as it was: x is (1, M), W is (M, N), z = x W / scale stored as float16.
    # X_ALONG_N=True is the earlier version whose output stayed in its notebook's last cell: it
    # broadcasts x along N instead of M, which compiles only because its blocks are square.
    pid = tl.program_id(axis=0)
    offs_m = tl.arange(0, BLOCK_SIZE_M)
    offs_n = (pid * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    x_ptrs = x_ptr + offs_m
    w_ptrs = w_ptr + (offs_m[:, None] * stride_wm + offs_n[None, :] * stride_wn)
    accumulator = tl.zeros((BLOCK_SIZE_N,), dtype=tl.float32)
    for m in range(0, tl.cdiv(M, BLOCK_SIZE_M)):
        if X_ALONG_N:
            x = tl.load(x_ptrs, mask=offs_m < M - m * BLOCK_SIZE_M, other=0.0)[None, :]
        else:
            x = tl.load(x_ptrs, mask=offs_m < M - m * BLOCK_SIZE_M, other=0.0)[:, None]
        w = tl.load(w_ptrs, mask=offs_m[:, None] < M - m * BLOCK_SIZE_M, other=0.0)
        elements_to_sum = tl.where(w > 0, x, tl.where(w < 0, -x, tl.zeros_like(x)))
        accumulator = accumulator + tl.sum(elements_to_sum, axis=0)
        x_ptrs += BLOCK_SIZE_M * stride_xm
        w_ptrs += BLOCK_SIZE_M * stride_wm
    accumulator = accumulator / scale
    z = accumulator.to(tl.float16)
    offs_z = pid * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    tl.store(z_ptr + offs_z, z, mask=offs_z < N)


def ternary_first_attempt(x: Tensor, w: Tensor, scale: float, *, x_along_n: bool = False) -> Tensor:
    """Run the first attempt's kernel (W is (K, N) here; 2x2 blocks; float16 out), bugs included."""
    k, n = w.shape
    z = torch.full((n,), float("nan"), dtype=torch.float16, device=x.device)
    first_attempt_kernel[(triton.cdiv(n, 2),)](x, w, z, scale, k, n, x.stride(0), w.stride(0), w.stride(1),
                                               BLOCK_SIZE_M=2, BLOCK_SIZE_N=2, X_ALONG_N=x_along_n)
    return z


def check() -> None:
    """Its own example gives both of its outputs; a fresh awkward input fails the float64 check; step 1 passes."""
    from studylog import ternary as T

    dev = studylog.device()
    s = torch.tensor([1.0, 2, 4, 8], device=dev)
    w = torch.tensor([[1.0, 0, 0, 0], [0, 1, 1, 0], [0, -1, 0, 1], [0, 0, 1, -1]], device=dev)  # (K, N)
    assert ternary_first_attempt(s, w, 1.0).tolist() == [1.0, -2.0, 10.0, -4.0]  # its last cell, right
    assert ternary_first_attempt(s, w, 1.0, x_along_n=True).tolist() == [1.0, -6.0, 5.0, 0.0]  # the wrong one

    gen = torch.Generator().manual_seed(0)
    k, n = 13, 7  # not multiples of its 2x2 blocks
    x = torch.randn(k, generator=gen).to(dev)
    wt = torch.randint(-1, 2, (n, k), generator=gen, dtype=torch.int8).to(dev)
    first_w = wt.T.contiguous().float()
    assert T.error_ratio(ternary_first_attempt(x, first_w, 1.0).float(), x, wt) > T.FP32_TOLERANCE  # float16 out
    assert T.error_ratio(ternary_first_attempt(x, first_w, 1.0, x_along_n=True).float(), x, wt) > 1e-2
    assert T.error_ratio(T.step01_sign(x, wt.float()), x, wt) <= T.FP32_TOLERANCE
    print("the first attempt reproduces both of its outputs and fails a fresh awkward input; step 1 passes")


if __name__ == "__main__":
    check()
