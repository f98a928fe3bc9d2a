"""Experiment (GPU): a timeline of step 23's blocks (notebook 05, "x queued behind the weights", "x first, by the
copy engine"): per block, when it starts, has read x, has quantised it, takes each chunk, and ends; per producer,
when it asks for each chunk. The stamps are the library kernel's own, built with -DW2A8_TIMELINE=1
(studylog.ternary.step23_timeline; the slots are listed in studylog/ternary/csrc/ternary_w2a8.cu).
Run on a GPU machine: PYTHONPATH=$PWD python lab/ternary/w2a8_timeline.py [CASE ...] (writes
$OUT/w2a8_timeline.json); a case is N,K,place[,row_tiles,stages], e.g. "4096,14336,staged,2,8" (default: both
Llama M = 1 shapes, every place, the default launch)."""
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
import triton

from studylog import bench, runtime
from studylog import ternary as T

run = bench.BenchRun("scratch", command="lab/ternary/w2a8_timeline.py " + " ".join(sys.argv[1:]))
sms = runtime.sm_count()
trace = torch.zeros(T.TIMELINE_SLOTS, dtype=torch.int64, device="cuda")
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
out = {}
cases = [(n, k, q, ()) for n, k in ((8192, 28672), (4096, 14336)) for q in T.W2A8_QUANTIZE]
if sys.argv[1:]:
    cases = [(int(c.split(",")[0]), int(c.split(",")[1]), c.split(",")[2], tuple(int(v) for v in c.split(",")[3:5]))
             for c in sys.argv[1:]]
for n, k, q, shape in cases:
    w = T.quantize_absmean(torch.randn(n, k, device="cuda"))[0]
    pw = T.PackedTernary.pack(w, "2bit_tiles")
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    chosen = None
    if shape:  # a launch of these row tiles and stages
        chosen = dataclasses.replace(T.w2a8_config(1, n, k, sms, quantize=q), row_tiles=shape[0], stages=shape[1])
    quant, cfg = T.w2a8_choose(1, n, k, chosen, q, sms)
    per_slice, grid = T.w2a8_grid(1, n, k, cfg, fused=quant != T.Quant.SEPARATE)
    call = T.step23_timeline(x, pw, 0.7, trace, config=chosen, quantize=q)
    assert torch.equal(call(), T.step23_w2a8_fused(x, pw, 0.7, config=chosen, quantize=q))
    kt = run.kernel_time(call) * 1e3
    blocks = grid[0] * grid[1] * grid[2]
    runs = []
    for rep in range(3):
        # as kernel_time: flush, then the launches queued behind it (no host gap)
        trace.zero_()
        flush.zero_()
        call()
        torch.cuda.synchronize()
        t = trace.cpu().double()
        tb = t[:64 * blocks].view(blocks, 64)
        start_ns, end_ns = tb[:, 0], tb[:, 63]
        cyc = tb[:, 3]  # end in cycles from the block's start
        ghz = (cyc / (end_ns - start_ns)).median().item()
        t0 = start_ns.min().item()
        if quant == T.Quant.SEPARATE:
            t0 = min(t0, t[120000].item())
        rel_start = (start_ns - t0) / 1e3

        def at(slot):  # us since t0, per block
            return rel_start + tb[:, slot] / ghz / 1e3

        def q3(v):
            v = v[v == v]
            return [round(v.min().item(), 2), round(v.median().item(), 2), round(v.max().item(), 2)]

        r = {"ghz": round(ghz, 3), "start": q3(rel_start), "x_read": q3(at(56)), "x_ready": q3(at(1)),
             "loop_end": q3(at(2)), "end": q3(at(3))}
        if quant == T.Quant.SEPARATE:
            r["quantize_x"] = [round((t[120000].item() - t0) / 1e3, 2), round((t[120001].item() - t0) / 1e3, 2)]
        chunks = min(24, triton.cdiv(per_slice, cfg.warps))
        r["take_median"] = [round(at(4 + c).median().item(), 2) for c in range(chunks)]
        r["fill_median"] = [round(at(32 + c).median().item(), 2) for c in range(chunks)]
        runs.append(r)
    name = f"{n}x{k} {q} probe0 cluster1" + (f" rt{shape[0]} st{shape[1]}" if shape else "")
    out[name] = {"kernel_us": kt, "cfg": repr(cfg), "runs": runs}
    print(f"{name}: {cfg} kernel {kt:.2f}", flush=True)
    for key, v in runs[-1].items():
        print("   ", key, v, flush=True)
meta = {key: v for key, v in run.to_json().items() if key not in ("measurements", "checks", "notes")}
Path(os.environ.get("OUT", "/tmp"), "w2a8_timeline.json").write_text(json.dumps({"meta": meta, "cases": out}, indent=1))
