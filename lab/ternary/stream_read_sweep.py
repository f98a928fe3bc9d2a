"""Experiment (GPU): how fast the SMs read N bytes (the copy engine into shared memory, plain 16-byte loads;
blocks an SM, chunk sizes, stages), and steps 21 and 23 over their compiled configs at the M = 1 targets.
read_only (studylog/csrc/read_only.cu) keeps the fastest. PYTHONPATH=$PWD python lab/ternary/stream_read_sweep.py"""
import itertools, json, os, sys, time
from pathlib import Path
import torch, triton
from studylog import cuda, bench, ternary as T, runtime

out_dir = Path(os.environ.get("OUT", "/tmp"))
run = bench.BenchRun("scratch", command="lab/ternary/stream_read_sweep.py")
print("copy GB/s", run.copy_bandwidth_gbs, "empty launch", run.empty_launch_ms)
sms = runtime.sm_count()
results = {"copy_gbs": run.copy_bandwidth_gbs, "stream": [], "steps": []}
src_text = (Path(__file__).parent / "stream_read_sweep.cu").read_text()
mod = cuda.load(src_text, name_expressions=["stream_ldg<2>", "stream_ldg<4>", "stream_ldg<8>"])
tma = mod.kernel("stream_tma", ["ptr", "u64", "u64", "i32", "i32", "ptr"])
tma.set_max_dynamic_shared_memory(227 * 1024)
ldg = {u: mod.kernel(f"stream_ldg<{u}>", ["ptr", "u64", "u64", "i32", "ptr"]) for u in (2, 4, 8)}
sink = torch.zeros(4096, dtype=torch.int32, device="cuda")
def kt(fn):
    return run.kernel_time(fn, reps=30) * 1e3
for nbytes in (4096 * 14336 // 4, 8192 * 28672 // 4):
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    for bps, chunk, inflight in itertools.product((1, 2, 3, 4), (4096, 8192, 16384, 32768), (32768, 65536, 131072, 196608)):
        stages = inflight // (bps * chunk)
        if stages < 2 or stages > 64 or bps * (stages * chunk + 2048) > 227 * 1024:
            continue
        grid = sms * bps
        per = triton.cdiv(triton.cdiv(nbytes, grid), 16) * 16
        fn = lambda: tma((grid,), (32,), src, nbytes, per, chunk, stages, sink, shared_mem=1024 + stages * chunk)
        us = kt(fn)
        r = dict(kind="tma", bytes=nbytes, bps=bps, chunk=chunk, stages=stages, us=us, gbs=nbytes / us / 1e3)
        results["stream"].append(r); print(r, flush=True)
    for u, threads, bps, layout in itertools.product((2, 4, 8), (256, 512, 1024), (1, 2, 4), (0, 1)):
        if threads * bps > 2048:
            continue
        grid = sms * bps
        n16 = nbytes // 16
        per16 = triton.cdiv(n16, grid)
        fn = lambda: ldg[u]((grid,), (threads,), src, n16, per16, layout, sink)
        us = kt(fn)
        r = dict(kind="ldg", bytes=nbytes, u=u, threads=threads, bps=bps, layout=layout, us=us, gbs=nbytes / us / 1e3)
        results["stream"].append(r); print(r, flush=True)

# Steps 21 and 23 over their compiled configs at the M = 1 targets
for n, k in ((4096, 14336), (8192, 28672)):
    w = T.quantize_absmean(torch.randn(n, k, device="cuda"))[0]
    scale = 0.7
    pw = T.PackedTernary.pack(w, "2bit_tiles")
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    for shape, warps in itertools.product(T.TMA_SHAPES, (4, 8, 16)):
        cfg = T.TmaConfig(*shape[:1], warps=warps, stages=shape[1], chunk=shape[2])
        try:
            fn = lambda: T.step21_magic_reg(x, pw, scale, config=cfg)
            fn()
            r = dict(step=11, n=n, k=k, cfg=repr(cfg), us=kt(fn), bench_us=run.time(fn) * 1e3)
        except Exception as e:
            r = dict(step=11, n=n, k=k, cfg=repr(cfg), error=str(e)[:200])
        results["steps"].append(r); print(r, flush=True)
    for q, shape, warps in itertools.product(("separate", "every block"), T.W2A8_SHAPES, (4, 8)):
        cfg = T.W2A8Config(*shape[:1], warps=warps, stages=shape[1], chunk=shape[2])
        try:
            fn = lambda: T.step23_w2a8_fused(x, pw, scale, config=cfg, quantize=q)
            fn()
            r = dict(step=12, q=q, n=n, k=k, cfg=repr(cfg), us=kt(fn), bench_us=run.time(fn) * 1e3)
        except Exception as e:
            r = dict(step=12, q=q, n=n, k=k, cfg=repr(cfg), error=str(e)[:200])
        results["steps"].append(r); print(r, flush=True)
(out_dir / "stream_read_sweep.json").write_text(json.dumps(results, indent=1))
