"""Where the model body's GPU time goes: its CUDA kernels, by time, for one decode step.

For a shape, batch and chunk length (default: the ~1B shape, batch 1, one token), the bodies of
``studylog.decode.LlamaModel``: the fused path the decode loop runs (``fused``: for one token a step, six
launches a layer), the same with cuBLAS's products and the norms and SwiGLU as kernels of their own
(``fused_cublas``: nine launches a layer, ``gemv=False``), and torch's eager operations (``torch``):

* the forward's GPU time replayed from a CUDA graph (the harness's clock, ``BenchRun.graph_time``), and the
  floor: the body's weights read once at the copy bandwidth the harness measures;
* the kernels of one forward (torch's profiler over a few eager forwards): launches per forward, and the
  top kernels by GPU time, with their calls and time per forward.

Public API only. On a GPU, from the repository root (well under a minute, most of it the profiler's start):

    python lab/decode/profile_body.py [--model 1b] [--batch 1] [--chunk 1] [--top 12] [--out DIR]

``--out DIR`` also writes ``DIR/<gpu>/profile_body_<model>_b<batch>_t<chunk>.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def kernel_table(fn, forwards: int = 5) -> list[dict]:
    """Each CUDA kernel of ``fn``: calls and GPU microseconds per forward, sorted by time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            fn()
        torch.cuda.synchronize()
    table: dict[str, dict] = {}
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != torch.autograd.DeviceType.CUDA:
            continue
        row = table.setdefault(e.name(), {"kernel": e.name(), "calls": 0, "us": 0.0})
        row["calls"] += 1
        row["us"] += e.duration_ns() / 1e3
    rows = [{**r, "calls": r["calls"] / forwards, "us": r["us"] / forwards} for r in table.values()]
    return sorted(rows, key=lambda r: -r["us"])


def main() -> None:
    from studylog.bench import BenchRun, write_lab_output
    from studylog.decode import LlamaModel, model_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=1)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    cfg = model_config(args.model)
    model = LlamaModel(cfg, device="cuda", dtype=torch.bfloat16, seed=0)
    B, T = args.batch, args.chunk
    cache = model.new_cache(B, 512 + 64)
    tokens = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
    start = torch.full((B,), 200, device="cuda")  # a step a few hundred tokens into a request
    last = torch.full((B,), T - 1, device="cuda")
    run = BenchRun("decode", command="python lab/decode/profile_body.py")  # the harness's clock and ceilings
    bandwidth = run.copy_bandwidth_gbs
    floor = run.floor_ms(cfg.parameter_counts()["body"] * 2)
    print(f"{torch.cuda.get_device_name()}: {args.model}, batch {B}, chunk {T}; copy bandwidth {bandwidth:.0f} GB/s, "
          f"body floor {floor:.3f} ms (its weights read once)")
    out = {"model": args.model, "batch": B, "chunk": T, "gpu": torch.cuda.get_device_name(),
           "copy_bandwidth_gbs": bandwidth, "floor_ms": floor, "bodies": {}}
    for name, fused, gemv in (("fused", True, None), ("fused_cublas", True, False), ("torch", False, None)):
        fn = lambda fused=fused, gemv=gemv: model(tokens, start, last, cache, fused=fused, gemv=gemv)  # noqa: E731
        ms = run.graph_time([fn])
        rows = kernel_table(fn)
        launches = sum(r["calls"] for r in rows)
        busy = sum(r["us"] for r in rows) / 1e3
        print(f"\n{name} body: {ms:.3f} ms per forward (graph replay), {ms / floor:.2f}x the floor; "
              f"{launches:.0f} kernels per forward ({launches / cfg.layers:.1f} per layer), {busy:.3f} ms of them "
              f"busy (eager)")
        print(f"  {'us/fwd':>8} {'calls':>6} {'us/call':>8}  kernel")
        for r in rows[:args.top]:
            print(f"  {r['us']:8.1f} {r['calls']:6.0f} {r['us'] / r['calls']:8.2f}  {r['kernel'][:100]}")
        out["bodies"][name] = {"graph_ms": ms, "kernels_per_forward": launches, "busy_ms": busy, "top": rows[:args.top]}
    if args.out is not None:
        path = write_lab_output(args.out, torch.cuda.get_device_name(), f"profile_body_{args.model}_b{B}_t{T}", out)
        print(f"\nwrote {path}")
    print(f"\n{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
