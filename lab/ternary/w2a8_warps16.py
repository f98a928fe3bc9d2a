"""Experiment (GPU), frozen: it runs at commit dfcb95c, whose ternary_w2a8.cu has the W2A8_MAX_WARPS knob (the
library no longer does). Step 23 with 16 consumer warps a block, against its default (8 at most: the kernel's launch
bounds). ternary_w2a8.cu built with -DW2A8_MAX_WARPS=16 raises the bounds to 544 threads; every launch is checked
bit for bit against the default's output, then timed by CUDA-graph replay over rotated weight copies, beside cuBLAS
and a weights-only read. PYTHONPATH=$PWD python lab/ternary/w2a8_warps16.py [--shapes 4096x14336,...]
(writes $OUT/w2a8_warps16.json)"""
import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from studylog import bench
from studylog import ternary as T
from studylog.bench import read_only
from studylog.ternary import w2a8 as W

parser = argparse.ArgumentParser()
parser.add_argument("--shapes", default="4096x14336,2560x6912,8192x28672,14336x4096,2560x2560,4800x3200,13824x2560")
parser.add_argument("--name", default="w2a8_warps16")
args = parser.parse_args()
BUILD = ("-DW2A8_MAX_WARPS=16",)
run = bench.BenchRun("scratch", command="lab/ternary/w2a8_warps16.py " + " ".join(sys.argv[1:]))

# the launch bounds are the only check that differs in this build: the refusal's "at most 8 warps" is lifted
refusal = W.w2a8_refusal
W.w2a8_refusal = lambda m, k, quant, cfg: refusal(m, k, quant, dataclasses.replace(cfg, warps=min(cfg.warps, 8))) \
    if W.w2a8_smem_bytes(cfg, m, -(-k // 256), staged=quant == W.Quant.STAGED) <= W.SMEM_LIMIT else "no room"


def launcher(x, pw, cfg, q, build):
    out = torch.empty(x.shape[0], pw.n, device="cuda")
    return W._w2a8_call(x, pw, 0.7, out, cfg, q, build=build)


res = []
for shape in args.shapes.split(","):
    n, k = map(int, shape.split("x"))
    w, _ = T.quantize_absmean(torch.randn(n, k, device="cuda"))
    pw = T.PackedTernary.pack(w, "2bit_tiles")
    rotation = run.rotated(pw)
    wd = w.to(torch.bfloat16)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    ref = T.step23_w2a8_fused(x, pw, 0.7)
    default = T.w2a8_default_quantize(1, n, k)
    row = dict(n=n, k=k, default=f"{T.w2a8_config(1, n, k)} {default}",
               cublas_graph_us=run.graph_time([lambda c=c: x @ c.T for c in run.rotated(wd)]) * 1e3,
               read_graph_us=run.graph_time([lambda c=c: read_only(c.data)() for c in rotation]) * 1e3,
               default_graph_us=run.graph_time([lambda c=c: T.step23_w2a8_fused(x, c, 0.7) for c in rotation]) * 1e3)
    print(row, flush=True)
    res.append(row)
    for q in ("staged", "every block"):
        for rt, st, ch in (W.W2A8_STAGED_SHAPES if q == "staged" else W.W2A8_SHAPES):
            for warps in (8, 16):
                cfg = T.W2A8Config(rt, warps=warps, stages=st, chunk=ch)
                r = dict(n=n, k=k, q=q, rt=rt, st=st, ch=ch, warps=warps)
                try:
                    build = BUILD if warps > 8 else ()
                    assert torch.equal(launcher(x, pw, cfg, q, build)(), ref), "differs from the default"
                    r["graph_us"] = run.graph_time([launcher(x, c, cfg, q, build) for c in rotation]) * 1e3
                except Exception as e:  # noqa: BLE001
                    r["error"] = str(e)[:160]
                res.append(r)
    best = sorted([r for r in res if r.get("n") == n and r.get("k") == k and "graph_us" in r],
                  key=lambda r: r["graph_us"])[:6]
    print(n, k, "default", round(row["default_graph_us"], 2), "cublas", round(row["cublas_graph_us"], 2),
          [(b["q"], b["rt"], b["st"], b["warps"], round(b["graph_us"], 2)) for b in best], flush=True)
    errs = [r for r in res if "error" in r and r.get("n") == n and "no room" not in r["error"]
            and "compiled" not in r["error"] and "shared memory" not in r["error"]]
    if errs:
        print("ERRORS", errs[:3], flush=True)
meta = {key: v for key, v in run.to_json().items() if key not in ("measurements", "checks", "notes")}
Path(os.environ.get("OUT", "/tmp"), f"{args.name}.json").write_text(json.dumps({"meta": meta, "results": res}, indent=1))
