"""Which tile suits the decode body's one-token products: ``gemv_kernel`` against cuBLAS, weight by weight.

The fused body's six-launch layer (``studylog.decode.kernels.gemv``) streams each weight with a Triton kernel
instead of cuBLAS, so that RMSNorm and SwiGLU run in front of the product and the residual add behind it. That
only pays if the kernel streams the weight about as fast as cuBLAS does. For every weight of the ~1B and ~8B
shapes (q/k/v, o, gate/up, down) at one token, this times, on the harness's clock (``BenchRun.graph_time``:
replayed in a CUDA graph, weights rotated among copies larger than L2):

* ``torch.nn.functional.linear`` (cuBLAS);
* ``gemv_kernel``'s plain form at every tile of a small grid (``BLOCK_N``, ``BLOCK_K``, warps, stages), and
  ``kernels.gemv`` at the tile the library picks (``gemv_tiles``);
* ``dot_tile_kernel`` below, the first version of the fused product, kept here because it lost: one tensor-core
  tile of 16 rows (the token padded with 15 zero rows) against ``[BLOCK_N, BLOCK_K]`` tiles of the weight, at a
  few tiles.

beside each weight's floor (its bytes at the copy bandwidth measured in the same run). Public API only. On a
GPU, from the repository root (a few minutes, most of it compiling the grid):

    python lab/decode/gemv_tiles.py [--out DIR]

``--out DIR`` writes ``DIR/<gpu>/gemv_tiles.json``.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

GEMV_GRID = {"BLOCK_N": (2, 4, 8, 16), "BLOCK_K": (256, 512, 1024), "warps_stages": ((4, 1), (4, 2), (4, 3), (8, 2))}
DOT_GRID = [(16, 256, 4, 3), (16, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 3)]  # BLOCK_N, BLOCK_K, warps, stages


@triton.jit
def dot_tile_kernel(x_ptr, w_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``out = W @ x`` for one token through a tensor-core product: the token is row 0 of a ``[16, BLOCK_K]`` tile
    whose 15 other rows are zeros, multiplied by the transposed ``[BLOCK_N, BLOCK_K]`` weight tile."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, 16)
    acc = tl.zeros((16, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + m[:, None] * 0 + k[None, :], mask=(m[:, None] == 0) & (k < K)[None, :], other=0.0)
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + k[None, :], mask=(n < N)[:, None] & (k < K)[None, :],
                    other=0.0)
        acc += tl.dot(a, tl.trans(w))
    y = tl.sum(tl.where(m[:, None] == 0, acc, 0.0), axis=0)
    tl.store(out_ptr + n, y.to(out_ptr.dtype.element_ty), mask=n < N)


def weights(cfg) -> dict[str, tuple[int, int]]:
    """``[N, K]`` of each of a layer's four weights."""
    return {"qkv": (cfg.qkv_rows, cfg.hidden), "o": (cfg.hidden, cfg.heads * cfg.head_dim),
            "gate_up": (2 * cfg.intermediate, cfg.hidden), "down": (cfg.hidden, cfg.intermediate)}


def main() -> None:
    from studylog.bench import BenchRun, write_lab_output
    from studylog.decode import kernels, model_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    run = BenchRun("decode", command="python lab/decode/gemv_tiles.py")
    out = {"gpu": torch.cuda.get_device_name(), "copy_bandwidth_gbs": run.copy_bandwidth_gbs, "cases": []}
    print(f"{out['gpu']}: copy bandwidth {run.copy_bandwidth_gbs:.0f} GB/s")

    def timed(launch, ws, y, ref):
        """GPU ms per call of ``launch(w)`` over the rotated weights, and whether its output is right; None where
        the tile does not fit the SM."""
        try:
            y.fill_(float("nan"))
            launch(ws[0])
            torch.cuda.synchronize()
        except triton.runtime.errors.OutOfResources:
            return None, False
        ok = bool(torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2))
        return run.graph_time([lambda w=w: launch(w) for w in ws]), ok

    for shape in ("1b", "8b"):
        for name, (N, K) in weights(model_config(shape)).items():
            ws = run.rotated(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02)
            x = torch.randn(K, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(N, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, ws[0]).float()
            case = {"model": shape, "weight": name, "N": N, "K": K, "floor_ms": run.floor_ms(N * K * 2),
                    "cublas_ms": run.graph_time([lambda w=w: F.linear(x, w) for w in ws]), "gemv": [], "dot_tile": []}
            for bn, bk, (warps, stages) in itertools.product(*GEMV_GRID.values()):
                def gemv(w, bn=bn, bk=bk, warps=warps, stages=stages):
                    kernels.gemv_kernel[(triton.cdiv(N, bn),)](
                        x, w, y, w, N, K, 0.0, NORM=False, SWIGLU=False, ADD=False, BLOCK_N=bn, BLOCK_K=bk,
                        K_POW2=triton.next_power_of_2(K), num_warps=warps, num_stages=stages)
                ms, ok = timed(gemv, ws, y, ref)
                case["gemv"].append({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages,
                                     "ms": ms, "correct": ok})
            for bn, bk, warps, stages in DOT_GRID:
                def dot(w, bn=bn, bk=bk, warps=warps, stages=stages):
                    dot_tile_kernel[(triton.cdiv(N, bn),)](x, w, y, N, K, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                                                           num_stages=stages)
                ms, ok = timed(dot, ws, y, ref)
                case["dot_tile"].append({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages,
                                         "ms": ms, "correct": ok})
            case["library_ms"] = run.graph_time([lambda w=w: kernels.gemv(x, w) for w in ws])
            case["library_tiles"] = kernels.gemv_tiles(N, K)
            for key in ("gemv", "dot_tile"):
                good = [t for t in case[key] if t["correct"] and t["ms"] is not None]
                case[f"best_{key}"] = min(good, key=lambda t: t["ms"]) if good else None
            out["cases"].append(case)
            b, d = case["best_gemv"], case["best_dot_tile"]
            print(f"{shape:3s} {name:8s} N={N:6d} K={K:6d}: floor {case['floor_ms'] * 1e3:6.1f} us, cuBLAS "
                  f"{case['cublas_ms'] * 1e3:6.1f}, library gemv {case['library_ms'] * 1e3:6.1f}, best gemv "
                  f"{b['ms'] * 1e3:6.1f} (BN={b['BLOCK_N']} BK={b['BLOCK_K']} w={b['num_warps']} s={b['num_stages']}), "
                  f"best dot tile {d['ms'] * 1e3 if d else float('nan'):6.1f}; wrong: "
                  f"{sum(not t['correct'] for t in case['gemv'] + case['dot_tile'] if t['ms'] is not None)}", flush=True)
            del ws
            torch.cuda.empty_cache()
    if args.out is not None:
        print(f"wrote {write_lab_output(args.out, out['gpu'], 'gemv_tiles', out)}")
    print(f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
