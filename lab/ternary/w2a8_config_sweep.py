"""Experiment (GPU): step 23 over its compiled configs x where x is quantised x splits of K, per M; the sweep
behind w2a8_config. Each config: profiler kernel time (us), do_bench (bench_us) and CUDA-graph replay over rotated
weight copies (graph_us, BenchRun.graph_time); per shape also cuBLAS, steps 14 and 21, the default and a kernel that
only reads the weights, by the same clocks.
PYTHONPATH=$PWD python lab/ternary/w2a8_config_sweep.py [--quantize "every block",staged] [--warps 8] [--m 1,16]
    [--slices 1,2,4] [--shapes 4096x14336] [--name sweep]  (writes $OUT/NAME.json)"""
import argparse
import dataclasses
import itertools
import json
import os
import sys
from pathlib import Path

import torch

from studylog import bench
from studylog import ternary as T
from studylog.bench import read_only

parser = argparse.ArgumentParser()
parser.add_argument("--quantize", default="separate,every block,staged", help="comma-separated places (W2A8_QUANTIZE)")
parser.add_argument("--warps", default="4,8")
parser.add_argument("--m", default="1", help="rows of x (above 8 only 'separate' applies)")
parser.add_argument("--slices", default="1", help="splits of K across blocks ('separate' only)")
parser.add_argument("--shapes", default="4096x14336,8192x28672", help="N x K, comma-separated")
parser.add_argument("--name", default="sweep", help="the output file's name, without .json")
args = parser.parse_args()
places, warp_counts = args.quantize.split(","), [int(w) for w in args.warps.split(",")]
for place in places:
    assert place in T.W2A8_QUANTIZE, f"{place!r}: the library quantises x at {list(T.W2A8_QUANTIZE)}"
run = bench.BenchRun("scratch", command="lab/ternary/w2a8_config_sweep.py " + " ".join(sys.argv[1:]))
res = []
shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]


def launcher(x, pw, cfg, q):
    out = torch.empty(x.shape[0], pw.n, device="cuda")
    return lambda: T.step23_w2a8_fused(x, pw, 0.7, out=out, config=cfg, quantize=q)


for n, k in shapes:
    w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda"))
    pw = T.PackedTernary.pack(w, "2bit_tiles")
    # copies of the weights for the CUDA-graph timing: each call of a replay reads its own from DRAM
    rotation = run.rotated(pw)
    wd = w.to(torch.bfloat16)
    pm = T.PackedTernary.pack(w, "2bit_mma")
    for m in [int(v) for v in args.m.split(",")]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = dict(n=n, k=k, m=m, cublas_us=run.kernel_time(lambda: x @ wd.T) * 1e3,
                   step11_us=run.kernel_time(lambda: T.step21_magic_reg(x, pw, scale)) * 1e3,
                   step9_us=run.kernel_time(lambda: T.step14_workspace(x, pm, scale)) * 1e3,
                   default=str(T.w2a8_config(m, n, k)), default_us=run.kernel_time(lambda: T.step23_w2a8_fused(x, pw, scale)) * 1e3,
                   cublas_graph_us=run.graph_time([lambda c=c: x @ c.T for c in run.rotated(wd)]) * 1e3,
                   default_graph_us=run.graph_time([lambda c=c: T.step23_w2a8_fused(x, c, scale) for c in rotation]) * 1e3)
        if m == 1:
            row["quantize_x_us"] = run.kernel_time(lambda: T.w2a8_quantize(x)) * 1e3
            row["read_weights_graph_us"] = run.graph_time([lambda c=c: read_only(c.data)() for c in rotation]) * 1e3
        print(row, flush=True)
        res.append(row)
        ref = T.step23_w2a8_fused(x, pw, 0.7, quantize="separate")
        plans = []
        for shape, warps in itertools.product(T.W2A8Config.SHAPES, warp_counts):
            cfg = T.W2A8Config(shape[0], warps=warps, stages=shape[1], chunk=shape[2])
            if m == 1 and "every block" in places:
                plans.append(("every block", cfg))
            if "separate" in places:
                for sl in [int(v) for v in args.slices.split(",")]:
                    plans.append(("separate", dataclasses.replace(cfg, slices=sl)))
            if m == 1 and "staged" in places and shape in T.W2A8_STAGED_SHAPES:
                plans.append(("staged", cfg))
        for q, cfg in plans:
            r = dict(n=n, k=k, m=m, q=q, rt=cfg.row_tiles, st=cfg.stages, ch=cfg.chunk, warps=cfg.warps,
                     slices=cfg.slices)
            try:
                fn = launcher(x, pw, cfg, q)
                assert torch.equal(fn(), ref), "differs from the separate default"
                r.update(us=run.kernel_time(fn) * 1e3, bench_us=run.time(fn, warmup=10, rep=40) * 1e3,
                         graph_us=run.graph_time([launcher(x, c, cfg, q) for c in rotation]) * 1e3)
            except Exception as e:
                r.update(error=str(e)[:150])
            res.append(r)
        for q in places if m == 1 else ("separate",):
            best = sorted([r for r in res if r.get("q") == q and (r["n"], r["k"], r["m"]) == (n, k, m) and "us" in r],
                          key=lambda r: r["graph_us"])[:5]
            print(n, k, m, q, "(rt, st, ch, warps, slices, kernel, do_bench, graph us)",
                  [(b["rt"], b["st"], b["ch"], b["warps"], b["slices"], round(b["us"], 2), round(b["bench_us"], 1),
                    round(b["graph_us"], 2)) for b in best], flush=True)
        errs = [r for r in res if "error" in r and (r["n"], r["k"], r["m"]) == (n, k, m)
                and "shared memory" not in r["error"] and "compiled instance" not in r["error"]]
        if errs:
            print("ERRORS", errs[:3], flush=True)
meta = {key: v for key, v in run.to_json().items() if key not in ("measurements", "checks", "notes")}
Path(os.environ.get("OUT", "/tmp"), f"{args.name}.json").write_text(json.dumps({"meta": meta, "results": res}, indent=1))
