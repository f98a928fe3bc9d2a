"""FROZEN (runs against the library as it was at commit 69a3b83, where step 12 was "step 10", w2a8_bulk_matmul, and
still had quantize="cluster"; check that commit out to run it). Kept because notebook 05 cites its output,
lab/ternary/results/nvidia-h200/w2a8_rows_hang.json.

Experiment (GPU): which of step 10's in-matmul quantisations hangs. The cluster test stopped at its first
M = 3 case (it runs quantize="every block", then "cluster" with clusters of 1 to 8), so this launches the compiled
instances directly with 1 to 8 rows of x. The first run (H200, 2026-11-25) hung only in "cluster" with a cluster
of 1 block and 1 consumer warp (M = 2 and 3), a launch that was then made without cluster dimensions; each case
now also says how it is launched: "plain" (no cluster dimensions, as then) or "cluster" (cuLaunchKernelEx with
the cluster's size, 1 included, as ternary.py launches it now). The cases run one after another in a worker
process (one compile); a case that outlives its time limit is reported as hung, the worker is killed and a new
one goes on with the next case.
PYTHONPATH=$PWD python tools/experiments/w2a8_rows_hang.py (its path then)   (writes $OUT/rows_hang.json)"""
import json, multiprocessing as mp, os, queue as queue_mod, sys
from pathlib import Path

CASES = [(place, m, cluster, warps, launch) for place, m, cluster, launch in
         [("every block", 1, 1, "plain"), ("every block", 3, 1, "plain"), ("every block", 8, 1, "plain"),
          ("cluster", 1, 1, "cluster"), ("cluster", 2, 1, "cluster"), ("cluster", 3, 1, "cluster"),
          ("cluster", 1, 2, "cluster"), ("cluster", 3, 2, "cluster"), ("cluster", 8, 4, "cluster"),
          ("cluster", 1, 1, "plain"), ("cluster", 3, 1, "plain")]
         for warps in (1, 8)]


def run_case(place: str, m: int, cluster: int, warps: int, launch: str) -> dict:
    import torch, triton
    from studylog import cuda, ternary as T
    n, k = 509, 2000
    gen = torch.Generator(device="cuda").manual_seed(3)
    w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda", generator=gen))
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    tiles = T.PackedTernary.pack(w, "2bit_tiles")
    cfg = T.W2A8Config(1, warps, 4, 1, cluster=cluster)
    groups = triton.cdiv(k, 256)
    name = T._w2a8_instance(T.W2A8_QUANTIZE[place], True, 1, 1, 4, 1)
    kernel = cuda.load("ternary_w2a8", name_expressions=[name]).kernel(name, T.W2A8_SIGNATURE)  # this one only
    kernel.set_max_dynamic_shared_memory(T.BULK_SMEM_LIMIT)
    z = torch.full((m, n), float("nan"), device="cuda")
    s = torch.full((1,), float(scale), device="cuda")
    # grid x: 32 blocks of one tile each (509 rows), a multiple of every cluster size
    kernel((triton.cdiv(n, 16), 1, 1), (32 * (warps + 1),), None, x, tiles.data, z, s, None, None, None, None, None,
           m, n, k, groups, x.stride(0), 0, groups, 0, shared_mem=T.w2a8_smem_bytes(cfg, m, groups),
           cluster=cluster if launch == "cluster" else None)
    torch.cuda.synchronize()
    # the W2A8 product as the kernel forms it: exact integer sums, then one float32 division
    xq, x_scale = T.quantize_activations(x.float())
    sums = (xq.double() @ w.double().T).float()  # exact: |sum| < 2^24
    ref = sums / (x_scale[:, None] * s)
    return {"equal": bool(torch.equal(z, ref)), "nan": int(torch.isnan(z).sum())}


def worker(cases, results) -> None:
    for case in cases:
        try:
            outcome = run_case(*case)
        except Exception as e:  # a launch error: report it and stop (the context may be gone)
            results.put({"error": repr(e)[:300]})
            return
        results.put(outcome)


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    limit = float(os.environ.get("CASE_TIMEOUT_S", "60"))
    rows, todo = [], list(CASES)
    while todo:
        results = ctx.Queue()
        proc = ctx.Process(target=worker, args=(todo, results))
        proc.start()
        done = 0
        while done < len(todo):
            try:  # the first case of a worker also waits for its compile
                outcome = results.get(timeout=limit + (120 if done == 0 else 0))
            except queue_mod.Empty:
                outcome = {"hung": True}
            place, m, cluster, warps, launch = todo[done]
            row = {"place": place, "m": m, "cluster": cluster, "warps": warps, "launch": launch, **outcome}
            print(row, flush=True)
            rows.append(row)
            done += 1
            if "hung" in outcome or "error" in outcome:
                break
        if proc.is_alive():
            proc.kill()
        proc.join()
        todo = todo[done:]
    Path(os.environ.get("OUT", "/tmp"), "rows_hang.json").write_text(json.dumps(rows, indent=1))
    sys.exit(0)
