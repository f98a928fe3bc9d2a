"""Experiment (GPU): a timeline of step 10's blocks (notebook 05, "x queued behind the weights"): per block,
when it starts, has read x, has quantised it, takes each chunk, and ends; per producer, when it issues each
fill. Run on a GPU machine: PYTHONPATH=$PWD python tools/experiments/w2a8_timeline.py [CASE ...] (writes
$OUT/trace2.json); a case is N,K,place[,cluster[,row_tiles,stages]], e.g. "8192,28672,cluster,2" or
"4096,14336,staged,0,2,8" (default: both bench shapes, every place, the default cluster and launch)."""
import dataclasses, json, os, sys
from pathlib import Path
import torch, triton
from studylog import cuda, bench, runtime, ternary as T


def traced_source() -> str:
    """ternary_w2a8.cu with %globaltimer / clock64 stamps at the points the notebook discusses."""
    s = Path(__file__).resolve().parents[2].joinpath("studylog/csrc/ternary_w2a8.cu").read_text()
    def rep(old, new):
        nonlocal s
        assert s.count(old) == 1, old[:70]
        s = s.replace(old, new)
    rep('#include "ternary_ring.cuh"', '''#include "ternary_ring.cuh"
__device__ unsigned long long g_trace[1 << 17];
__device__ __forceinline__ unsigned long long gtime() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
#define BLK (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))
#define TRC(i) g_trace[64 * BLK + (i)] = (unsigned long long)(clock64() - t_start)
''')
    rep('''    if (W2A8_PROBE == 3) return;
    if (threadIdx.x == 0) {
        ring.init(warps);''', '''    if (W2A8_PROBE == 3) return;
    const long long t_start = clock64();
    if (threadIdx.x == 0) { g_trace[64 * BLK] = gtime(); }
    if (threadIdx.x == 0) {
        ring.init(warps);''')
    rep('''        for (int c = 0; lane == 0 && c < first; ++c) ring.fill(c, policy);''',
        '''        for (int c = 0; lane == 0 && c < first; ++c) { ring.fill(c, policy); if (c < 24) TRC(32 + c); }''')
    rep('''            for (int c = first; lane == 0 && W2A8_PROBE != 2 && c < chunks; ++c) ring.fill(c, policy);''',
        '''            for (int c = first; lane == 0 && W2A8_PROBE != 2 && c < chunks; ++c) { ring.fill(c, policy); if (c < 24) TRC(32 + c); }''')
    rep('''                for (int c = first; row == 0 && lane == 0 && c < free_stages; ++c) ring.fill(c, policy);''',
        '''                for (int c = first; row == 0 && lane == 0 && c < free_stages; ++c) { ring.fill(c, policy); if (c < 24) TRC(32 + c); }''')
    rep('''            for (int c = free_stages; lane == 0 && W2A8_PROBE != 2 && c < chunks; ++c) ring.fill(c, policy);''',
        '''            for (int c = free_stages; lane == 0 && W2A8_PROBE != 2 && c < chunks; ++c) { ring.fill(c, policy); if (c < 24) TRC(32 + c); }''')
    rep('''                            asm volatile("bar.arrive 2, %0;" ::"r"((warps + 1) * 32) : "memory");''',
        '''                            asm volatile("bar.arrive 2, %0;" ::"r"((warps + 1) * 32) : "memory");
                        if (row == 0 && tid == 0) TRC(56);''')
    rep('''        consumer_barrier(warps);
        int acc[4][RT][MT][4] = {};''', '''        consumer_barrier(warps);
        if (tid == 0) TRC(1);
        int acc[4][RT][MT][4] = {};''')
    rep('''            const int gc = ring.group(c, warp), ng = ring.take(c, warp, lane, a, W2A8_PROBE != 2);
''', '''            const int gc = ring.group(c, warp), ng = ring.take(c, warp, lane, a, W2A8_PROBE != 2);
            if (threadIdx.x == 0 && c < 24) TRC(4 + c);
''')
    rep('''        add_warp_sums<RT, MT>(''', '''        if (threadIdx.x == 0) TRC(2);
        add_warp_sums<RT, MT>(''')
    rep('''    if (!FUSED && gridDim.y > 1) {
        asm volatile("griddepcontrol.wait;" ::: "memory");  // every thread''', '''    if (threadIdx.x == 0) { TRC(3); g_trace[64 * BLK + 63] = gtime(); }
    if (!FUSED && gridDim.y > 1) {
        asm volatile("griddepcontrol.wait;" ::: "memory");  // every thread''')
    rep('''    float scale;
    int total;
    quantize_row<BF16, 4>(''', '''    if (threadIdx.x == 0) g_trace[120000] = gtime();
    float scale;
    int total;
    quantize_row<BF16, 4>(''')
    rep('''                    cluster_arrive();  // A (with the producers): the cluster has read the row
                    cluster_wait();''', '''                    cluster_arrive();  // A (with the producers): the cluster has read the row
                    cluster_wait();
                    if (row == 0 && tid == 0) TRC(56);''')
    rep('''        x_scale[blockIdx.x] = scale;
    }''', '''        x_scale[blockIdx.x] = scale;
        g_trace[120001] = gtime();
    }''')
    return s



run = bench.BenchRun("scratch", command="tools/experiments/w2a8_timeline.py")
sms = runtime.sm_count()
src = traced_source()
mod = cuda.load(src, name_expressions=T.W2A8_QUANTIZE_INSTANCES + T.W2A8_INSTANCES)
qk = mod.kernel("quantize_x<true>", T.W2A8_QUANTIZE_SIGNATURE)
drv = cuda._driver()
_, dptr, size = drv.cuModuleGetGlobal(mod.handle, b"g_trace")
trace = torch.zeros(1 << 17, dtype=torch.int64, device="cuda")
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
out = {}
cases = [(n, k, q, None) for n, k in ((8192, 28672), (4096, 14336)) for q in ("separate", "every block", "cluster")]
if sys.argv[1:]:
    cases = [(int(c.split(",")[0]), int(c.split(",")[1]), c.split(",")[2], None, int((c.split(",") + ["0"])[3]),
              tuple(int(v) for v in c.split(",")[4:6])) for c in sys.argv[1:]]
else:
    cases = [case + (0, ()) for case in cases]
for n, k, q, probe, cluster, shape in cases:
    w = T.quantize_absmean(torch.randn(n, k, device="cuda"))[0]
    pw = T.PackedTernary.pack(w, "2bit_tiles")
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    s = torch.full((1,), 0.7, device="cuda")
    z = torch.empty(1, n, device="cuda")
    groups = triton.cdiv(k, 256)
    chosen = dataclasses.replace(T.w2a8_config(1, n, k, sms, quantize=q), cluster=cluster) if cluster else None
    if shape:  # a launch of these row tiles and stages
        chosen = dataclasses.replace(chosen or T.w2a8_config(1, n, k, sms, quantize=q), row_tiles=shape[0],
                                     stages=shape[1])
    quant, cfg, per_slice, grid, name, smem = T._w2a8_plan(1, n, k, True, chosen, q, sms)
    if probe:
        m2 = cuda.load(src, name_expressions=[name], options=(f"-DW2A8_PROBE={probe}",))
        kern = m2.kernel(name, T.W2A8_SIGNATURE); dp = drv.cuModuleGetGlobal(m2.handle, b"g_trace")[1]
    else:
        kern = mod.kernel(name, T.W2A8_SIGNATURE); dp = dptr
    kern.set_max_dynamic_shared_memory(T.BULK_SMEM_LIMIT)
    block = (32 * (cfg.warps + 1),)
    xq = torch.empty(1, groups * 256, dtype=torch.int8, device="cuda")
    xs, rs = torch.empty(1, device="cuda"), torch.empty(1, dtype=torch.int32, device="cuda")
    def call():
        if quant == 0:
            qk((1,), (1024,), x, xq, xs, rs, k, x.stride(0), groups)
        kern(grid, block, xq, x, pw.data, z, s, xs, rs, None, None, None, 1, n, k, groups, x.stride(0), 0,
             per_slice, 0, shared_mem=smem, early=quant == 0,
             cluster=cfg.cluster if quant == 3 else None)
    call(); torch.cuda.synchronize()
    if not probe:
        assert torch.equal(z, T.w2a8_bulk_matmul(x, pw, 0.7, quantize=q))
    kt = run.kernel_time(call) * 1e3
    blocks = grid[0] * grid[1] * grid[2]
    runs = []
    for rep in range(3):
        # as kernel_time: flush, then both launches queued behind it (no host gap)
        drv.cuMemsetD8(dp, 0, size)
        flush.zero_(); call(); torch.cuda.synchronize()
        drv.cuMemcpyDtoD(trace.data_ptr(), dp, size); torch.cuda.synchronize()
        t = trace.cpu().double()
        tb = t[:64 * blocks].view(blocks, 64)
        start_ns, end_ns = tb[:, 0], tb[:, 63]
        cyc = tb[:, 3]  # end in cycles from the block's start
        ghz = (cyc / (end_ns - start_ns)).median().item()
        t0 = start_ns.min().item()
        if quant == 0:
            t0 = min(t0, t[120000].item())
        rel_start = (start_ns - t0) / 1e3
        def at(slot):  # us since t0, per block
            return rel_start + tb[:, slot] / ghz / 1e3
        def q3(v):
            v = v[v == v]
            return [round(v.min().item(), 2), round(v.median().item(), 2), round(v.max().item(), 2)]
        r = {"ghz": round(ghz, 3), "start": q3(rel_start), "x_read": q3(at(56)), "x_ready": q3(at(1)), "loop_end": q3(at(2)), "end": q3(at(3))}
        if quant == 0:
            r["quantize_x"] = [round((t[120000].item() - t0) / 1e3, 2), round((t[120001].item() - t0) / 1e3, 2)]
        r["take_median"] = [round(at(4 + c).median().item(), 2) for c in range(min(24, triton.cdiv(per_slice, cfg.warps)))]
        r["fill_median"] = [round(at(32 + c).median().item(), 2) for c in range(min(24, triton.cdiv(per_slice, cfg.warps)))]
        runs.append(r)
    out[f"{n}x{k} {q} probe{probe} cluster{cfg.cluster}" + (f" rt{shape[0]} st{shape[1]}" if shape else "")] = {"kernel_us": kt, "cfg": repr(cfg), "runs": runs}
    print(f"{n}x{k} {q} probe{probe} {cfg} kernel {kt:.2f}", flush=True)
    for r in runs[-1:]:
        for key, v in r.items():
            print("   ", key, v, flush=True)
meta = {key: v for key, v in run.to_json().items() if key not in ("measurements", "checks", "notes")}
Path(os.environ.get("OUT", "/tmp"), "trace2.json").write_text(json.dumps({"meta": meta, "cases": out}, indent=1))
