"""Chapter 0's measurements: the GPU's ceilings (copy bandwidth, matmul rates, launch times).

Every other chapter's floors and ratios are read against these; notebook 00 shows them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from studylog.chapter import Chapter

if TYPE_CHECKING:
    from studylog.bench import BenchRun

_EMPTY_CU = r"""
extern "C" __global__ void empty_kernel(float* out, int n) {
    if (n < 0) out[0] = 0.0f;  // never true: the kernel does no work
}
"""


def bench(run: "BenchRun") -> None:
    """Copy bandwidth at several sizes, bf16/fp32 matmul rates and empty-launch times."""
    from studylog import cuda

    sizes = [1 << 24, 1 << 26, 1 << 28, 1 << 30, 1 << 32]
    for nbytes in run.progress(sizes, "copy bandwidth"):
        src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
        dst = torch.empty_like(src)
        ms = run.time(lambda: dst.copy_(src))
        run.record("copy", ms, params={"bytes": nbytes}, role="baseline", gbs=2 * nbytes / (ms * 1e-3) / 1e9)
        del src, dst
    for dtype, n in run.progress([(torch.bfloat16, 4096), (torch.bfloat16, 8192), (torch.float32, 8192)], "matmul"):
        a = torch.randn(n, n, dtype=dtype, device="cuda")
        b = torch.randn(n, n, dtype=dtype, device="cuda")
        ms = run.time(lambda: a @ b)
        run.record(f"matmul_{str(dtype).removeprefix('torch.')}", ms, params={"n": n}, role="baseline",
                   tflops=2 * n**3 / (ms * 1e-3) / 1e12)
        del a, b
    run.record("empty_triton_launch", run.empty_launch_ms, params={}, role="baseline")
    kernel = cuda.load(_EMPTY_CU).kernel("empty_kernel", ["ptr", "i32"])
    x = torch.empty(1, device="cuda")
    kernel((1,), (32,), x, 1)
    torch.cuda.synchronize()
    run.record("empty_nvrtc_launch", run.time(lambda: kernel((1,), (32,), x, 1)), params={}, role="baseline")
    y = torch.empty(1, device="cuda")
    run.record("torch_add_launch", run.time(lambda: y.add_(1.0)), params={}, role="baseline")


CHAPTER = Chapter(
    name="env", number=0, title="How to read and run this course: the GPU's ceilings", notebooks=("00_how_to_read",),
    steps=(), bench=bench,
    baselines={
        "copy": "device-to-device copy (torch)",
        "matmul_bfloat16": "torch matmul, bf16 (cuBLAS)",
        "matmul_float32": "torch matmul, fp32 (cuBLAS)",
        "empty_triton_launch": "an empty Triton kernel's launch",
        "empty_nvrtc_launch": "an empty CUDA C++ kernel's launch",
        "torch_add_launch": "a one-element torch add",
    },
)
