"""Experiment (GPU): the launches of step 25 (and step 22) for Nsight Compute to read, at 4096 x 14336:
ncu --clock-control none -k regex:step25_x_tma --launch-skip 4 --launch-count 1 --section WarpStateStats \\
    python lab/ternary/w2a8_tiles_profile.py 16 [8,1,4,2,4]   (rows of x, a W2A8TilesConfig; PYTHONPATH=$PWD)
Five calls of step 25 (its default config unless one is given), then five of step 22."""
import sys
import torch
from studylog import ternary as T

m = int(sys.argv[1]) if len(sys.argv) > 1 else 16
config = T.W2A8TilesConfig(*(int(v) for v in sys.argv[2].split(","))) if len(sys.argv) > 2 else None
w, scale = T.quantize_absmean(torch.randn(4096, 14336, device="cuda"))
tiles = T.PackedTernary.pack(w, "2bit_tiles")
x = torch.randn(m, 14336, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    T.step25_x_tma(x, tiles, scale, config=config)
for _ in range(5):
    T.step22_w2a8(x, tiles, scale)
torch.cuda.synchronize()
print("config", config or T.w2a8_tiles_config(m, 4096, 14336))
