"""Experiment (GPU): what binds the final W2A8 kernels at the targets' shapes, for Nsight Compute to read.
Warm-up calls first (compilation, autotuning), then inside cudaProfilerStart/Stop, at 4096 x 14336: step 23 at
M = 1 (its default: x quantised in every block from a staged copy), cuBLAS bf16 at M = 1, step 25 and step 14 (the
fastest of the chapter's kernels there) at M = 16 and cuBLAS bf16 at M = 16, one call each (NVTX ranges name them). Run (PYTHONPATH=$PWD):
ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \\
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \\
    --csv --page details python lab/ternary/w2a8_ncu.py > ncu.csv"""
import torch

from studylog import ternary as T

n, k = 4096, 14336
w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda"))
tiles = T.PackedTernary.pack(w, "2bit_tiles")
mma = T.PackedTernary.pack(w, "2bit_mma")
dense = w.to(torch.bfloat16)
xs = {m: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for m in (1, 16)}
calls = [("step23 M=1", lambda: T.step23_w2a8_fused(xs[1], tiles, scale)), ("cublas M=1", lambda: xs[1] @ dense.T),
         ("step25 M=16", lambda: T.step25_x_tma(xs[16], tiles, scale)),
         ("step14 M=16", lambda: T.step14_workspace(xs[16], mma, scale)), ("cublas M=16", lambda: xs[16] @ dense.T)]
for _ in range(3):
    for _, call in calls:
        call()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for name, call in calls:
    torch.cuda.nvtx.range_push(name)
    call()
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("profiled:", ", ".join(name for name, _ in calls))
