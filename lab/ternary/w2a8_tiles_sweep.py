"""Experiment (GPU): step 25 (w2a8_tiles_kernel) over its compiled configs x splits of K, per M and shape, by
CUDA-graph replay (rotated weight copies) and profiler kernel time, each config checked bit for bit against
step 22; the sweep behind w2a8_tiles_config. Step 14 and cuBLAS bf16 are timed in the same run.
PYTHONPATH=$PWD python lab/ternary/w2a8_tiles_sweep.py [--m 1,16] [--shapes 4096x14336] [--slices 1,2,4]
(writes $OUT/w2a8_tiles_sweep.json, or w2a8_tiles_parts.json with --parts)"""
import argparse, json, os, sys
from pathlib import Path
import torch
from studylog import bench, ternary as T

parser = argparse.ArgumentParser()
parser.add_argument("--m", default="1,16", help="rows of x, comma-separated")
parser.add_argument("--shapes", default="4096x14336,8192x28672", help="N x K, comma-separated")
parser.add_argument("--slices", default="1,2,3,4,6,8", help="splits of K to try (more where x would not fit)")
parser.add_argument("--parts", action="store_true", help="only the default config, timed whole and in parts: "
                    "quantize_x alone and a kernel that only reads the weights")
args = parser.parse_args()
run = bench.BenchRun("scratch", command="lab/ternary/w2a8_tiles_sweep.py " + " ".join(sys.argv[1:]))
results = []
for shape in args.shapes.split(","):
    n, k = (int(v) for v in shape.split("x"))
    w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda"))
    tiles, pm, wd = T.PackedTernary.pack(w, "2bit_tiles"), T.PackedTernary.pack(w, "2bit_mma"), w.to(torch.bfloat16)
    rotation, rotation_mma, rotation_bf16 = run.rotated(tiles), run.rotated(pm), run.rotated(wd)
    for m in (int(v) for v in args.m.split(",")):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = T.step22_w2a8(x, tiles, scale)
        row = dict(n=n, k=k, m=m, default=str(T.w2a8_tiles_config(m, n, k)),
                   cublas_graph_us=run.graph_time([lambda c=c: x @ c.T for c in rotation_bf16]) * 1e3,
                   step9_graph_us=run.graph_time([lambda c=c: T.step14_workspace(x, c, scale) for c in rotation_mma]) * 1e3,
                   step12_graph_us=run.graph_time([lambda c=c: T.step23_w2a8_fused(x, c, scale) for c in rotation]) * 1e3)
        print(row, flush=True)
        results.append(row)
        if args.parts:
            # (the matmul alone, x quantised beforehand, is not a public launch: the committed
            # w2a8_tiles_parts_loads.json has it, from this script at ef696d7)
            parts = dict(n=n, k=k, m=m, parts=str(T.w2a8_tiles_config(m, n, k)),
                         equal=bool(torch.equal(T.step25_x_tma(x, tiles, scale), want)),
                         whole_graph_us=run.graph_time([lambda c=c: T.step25_x_tma(x, c, scale) for c in rotation]) * 1e3,
                         quantize_x_graph_us=run.graph_time([lambda: T.w2a8_quantize(x)]) * 1e3,
                         read_weights_graph_us=run.graph_time([bench.read_only(c.data) for c in rotation]) * 1e3)
            print(parts, flush=True)
            results.append(parts)
            continue
        seen = set()
        for warps in (4, 8):
            for tiles_a_warp, stages, chunk in T.W2A8_TILES_SHAPES:
                for slices in (int(v) for v in args.slices.split(",")):
                    cfg = T.W2A8TilesConfig(warps, tiles_a_warp, stages, chunk, slices)
                    _, grid = T.w2a8_grid(m, n, k, cfg)
                    if (cfg.warps, cfg.tiles, cfg.stages, cfg.chunk, grid) in seen:
                        continue  # asked for fewer slices than x needs: the same launch as one already timed
                    seen.add((cfg.warps, cfg.tiles, cfg.stages, cfg.chunk, grid))
                    r = dict(n=n, k=k, m=m, warps=warps, tiles=tiles_a_warp, stages=stages, chunk=chunk, slices=slices,
                             grid=grid)
                    fn = lambda: T.step25_x_tma(x, tiles, scale, config=cfg)
                    r["equal"] = bool(torch.equal(fn(), want))
                    r["kernel_us"] = run.kernel_time(fn) * 1e3
                    r["graph_us"] = run.graph_time(
                        [lambda c=c, cfg=cfg: T.step25_x_tma(x, c, scale, config=cfg) for c in rotation]) * 1e3
                    results.append(r)
        mine = sorted((r for r in results if (r.get("n"), r.get("k"), r.get("m")) == (n, k, m) and "graph_us" in r),
                      key=lambda r: r["graph_us"])
        print(n, k, m, "(warps, tiles, stages, chunk, grid, kernel us, graph us, equal):",
              [(r["warps"], r["tiles"], r["stages"], r["chunk"], r["grid"], round(r["kernel_us"], 2), round(r["graph_us"], 2),
                r["equal"]) for r in mine[:6]], flush=True)
        if not all(r["equal"] for r in mine):
            print("NOT EQUAL to step 22:", [r for r in mine if not r["equal"]][:3], flush=True)
meta = {key: v for key, v in run.to_json().items() if key not in ("measurements", "checks", "notes")}
Path(os.environ.get("OUT", "/tmp"), "w2a8_tiles_parts.json" if args.parts else "w2a8_tiles_sweep.json").write_text(
    json.dumps({"meta": meta, "results": results}, indent=1))
