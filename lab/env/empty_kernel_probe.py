"""Does the GPU's clock state explain the two values of the empty kernel's GPU-clock time on the H200 (0.56 and
0.88 µs in the committed runs)? Times it as every benchmark run does at its start (CUDA-graph replay), on a GPU left
idle and right after 3 s of matmuls, with the SM and memory clocks (nvidia-smi) read before and after each.

Run on a GPU machine from the repository root: PYTHONPATH=$PWD python lab/env/empty_kernel_probe.py (writes
$OUT/empty_kernel_probe.json, or /tmp without OUT).
"""
import json, os, subprocess, time
from pathlib import Path
import torch
from studylog.bench import BenchRun, empty_launch

def clocks():
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,pstate", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return out

rows = []
def probe(label, run, launch):
    before = clocks()
    t = run.gpu_time(lambda: [launch])
    after = clocks()
    rows.append({"when": label, "empty_gpu_us": t.median * 1e3, "spread_us": [s * 1e3 for s in t.spread], "clock_before": before, "clock_after": after})
    print(rows[-1], flush=True)

print("start", clocks(), flush=True)
run = BenchRun("probe", command="empty probe")  # measures the empty kernel at its start, as every chapter's run
rows.append({"when": "BenchRun start (cold)", "empty_gpu_us": run.empty_launch_gpu.median * 1e3, "clock_after": clocks()})
print(rows[-1], flush=True)
launch = empty_launch()
for cycle in range(3):
    time.sleep(8)
    probe(f"after 8 s idle #{cycle}", run, launch)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < 3:
        a @ a
    torch.cuda.synchronize()
    probe(f"right after 3 s of matmuls #{cycle}", run, launch)
Path(os.environ.get("OUT", "/tmp"), "empty_kernel_probe.json").write_text(json.dumps(rows, indent=1))
