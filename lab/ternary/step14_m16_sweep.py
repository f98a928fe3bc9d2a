"""Experiment (GPU): step 14 (Triton) at several rows of x over a wider grid of its launch configs than its
autotuner's seven: can a config reach 3x cuBLAS at M = 16, 4096 x 14336 (the target: 11.0 µs against about 33)?
Each config is checked against the default launch (float32 sums in another order: allclose), then timed by CUDA-graph
replay over rotated weight copies (BenchRun.graph_time), with cuBLAS bf16 and the default in the same run.
PYTHONPATH=$PWD python lab/ternary/step14_m16_sweep.py [--m 16] [--shapes 4096x14336] [--name step14_m16_sweep]
    (writes $OUT/NAME.json)"""
import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch

from studylog import bench
from studylog import ternary as T

parser = argparse.ArgumentParser()
parser.add_argument("--m", default="16", help="rows of x, comma-separated")
parser.add_argument("--shapes", default="4096x14336", help="N x K, comma-separated")
parser.add_argument("--name", default="step14_m16_sweep", help="the output file's name, without .json")
args = parser.parse_args()
run = bench.BenchRun("scratch", command="lab/ternary/step14_m16_sweep.py " + " ".join(sys.argv[1:]))
# (BLOCK_N, num_warps) x BLOCK_KW x SPLIT_K x num_stages; BLOCK_N = 64 is one warpgroup's wgmma tile
CONFIGS = [dict(BLOCK_N=bn, num_warps=nw, BLOCK_KW=kw, SPLIT_K=sk, num_stages=st)
           for (bn, nw), kw, sk, st in itertools.product(((64, 4), (128, 8)), (16, 32), (2, 4, 8, 16), (3, 4, 5))]
res = []
for n, k in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]:
    w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda"))
    pm = T.PackedTernary.pack(w, "2bit_mma")
    rotation = run.rotated(pm)
    wd = w.to(torch.bfloat16)
    for m in [int(v) for v in args.m.split(",")]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = T.step14_workspace(x, pm, scale).clone()
        base = dict(n=n, k=k, m=m,
                    cublas_graph_us=run.graph_time([lambda c=c: x @ c.T for c in run.rotated(wd)]) * 1e3,
                    default_graph_us=run.graph_time([lambda c=c: T.step14_workspace(x, c, scale)
                                                     for c in rotation]) * 1e3)
        print(base, flush=True)
        res.append(base)
        for cfg in CONFIGS:
            r = dict(n=n, k=k, m=m, **cfg)
            try:
                out = T.step14_workspace(x, pm, scale, config=cfg)
                assert torch.allclose(out, ref, rtol=1e-4, atol=1e-3), "differs from the default launch"
                r["graph_us"] = run.graph_time([lambda c=c: T.step14_workspace(x, c, scale, config=cfg)
                                                for c in rotation]) * 1e3
            except Exception as e:  # no room (shared memory), or a wrong answer: recorded, never timed
                r["error"] = f"{type(e).__name__}: {str(e)[:150]}"
            res.append(r)
        best = sorted([r for r in res if "graph_us" in r and (r["n"], r["k"], r["m"]) == (n, k, m)],
                      key=lambda r: r["graph_us"])[:6]
        print(n, k, m, "best:", [(b["BLOCK_N"], b["num_warps"], b["BLOCK_KW"], b["SPLIT_K"], b["num_stages"],
                                  round(b["graph_us"], 2)) for b in best],
              "cuBLAS / best:", round(base["cublas_graph_us"] / best[0]["graph_us"], 2) if best else None, flush=True)
meta = {key: v for key, v in run.to_json().items() if key not in ("measurements", "checks", "notes")}
Path(os.environ.get("OUT", "/tmp"), f"{args.name}.json").write_text(json.dumps({"meta": meta, "results": res}, indent=1))
