"""Chapter 5, step 22 timed in parts: what its kernel of quantisation costs and what launching the matmul early buys.

Step 22 makes five changes to step 21. Three of them cannot run apart: the int8 ``m16n8k32`` MMA takes int8 operands,
the one AND per 4 weights is what makes the 2-bit words such an operand, and the four accumulators (one per code
position) are what that AND leaves to sum. The other two can: x quantised first by a kernel of its own
(``quantize_x``), and the matmul launched early behind it (a programmatic dependent launch). Series ``step22_parts``,
one row per variant:

* ``step 21``: the library's step 21 (the anchor, float x; at one row only);
* ``step 22's matmul alone (x given as int8)``: step 22's matmul launched by itself on x quantised beforehand (outside
  the timed calls), the product of the int8 MMA with x handed over as int8, as BitNet's kernel takes it;
* ``quantize_x``: the quantisation kernel alone (``w2a8_quantize``);
* ``step 22, launched after``: step 22 with its matmul launched once ``quantize_x`` has ended (``early=False``);
* ``step 22``: the library's step 22, its matmul launched early.

    PYTHONPATH=$PWD python lab/ternary/step22_parts.py      # GPU (Hopper): writes results/<gpu>/step22_parts.json

GPU clock (CUDA-graph replay over copies of the weights past L2, fresh x, three repetitions), as the chapter's
benchmark times a step; every row of step 22 is checked bit-identical to the other launch and within the chapter's
tolerance of the float64 W2A8 reference.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from studylog import paths
from studylog import ternary as T
from studylog.ternary.w2a8 import w2a8_quantize

CASES = ((4096, 14336, 1), (4096, 14336, 16), (2560, 6912, 1))
MATMUL_ALONE = "step 22's matmul alone (x given as int8)"
VARIANTS = ("step 21", MATMUL_ALONE, "quantize_x", "step 22, launched after", "step 22")


def matmul_alone(x, w):
    """Step 22's matmul by itself: x quantised here, once, then a call that launches only the int8 matmul (the library
    launches it only behind quantize_x, so this reaches the module's private launch pieces, as lab scripts may)."""
    from studylog.ternary import w2a8 as W

    x2, vector, w, s, s_stride, z = W._w2a8_args(x, w, 1.0, None, None, W.W2A8Config, 22, "w2a8_kernel")
    m = x2.shape[0]
    launch = W._w2a8_launch(m, w, x2.dtype == torch.bfloat16, x2.device, None, "separate")
    sums, counts = W.CUDA_WORKSPACE.get(x2.device, launch.grid[1] * m, w.n) if launch.grid[1] > 1 else (None, None)
    partials = sums.view(torch.int32) if sums is not None else None
    xq, x_scale, row_sum = W._quantize_x(x2)
    args = launch.args(None, xq, x_scale, row_sum, w, z, s, partials, counts, m, x2.stride(0), s_stride)

    def call():
        launch.kernel(launch.grid, launch.block, *args, shared_mem=launch.smem, early=False)
        return z
    return call


def call_of(variant: str, x, w):
    if variant == "step 21":
        return lambda: T.step21_magic_reg(x, w)
    if variant == MATMUL_ALONE:
        return matmul_alone(x, w)
    if variant == "quantize_x":
        return lambda: w2a8_quantize(x)
    return lambda: T.step22_w2a8(x, w, early=variant == "step 22")


def main() -> Path:
    from studylog.bench import BenchRun, write_lab_output

    run = BenchRun("ternary", command=" ".join(["python", *sys.argv]))
    run.note("Series step22_parts: step 21, step 22's matmul alone on x quantised beforehand, quantize_x alone, step 22 with its matmul launched after quantize_x "
             "(early=False) and step 22 (launched early); bf16 x ~ N(0, 1), ternary W uniform in {-1, 0, 1}, scale 1; "
             "GPU clock (CUDA-graph replay over copies of the packed weights past L2, fresh x a repetition).")
    gen = torch.Generator(device="cuda").manual_seed(22)
    for n, k, m in run.progress(CASES, "cases"):
        w8 = torch.randint(-1, 2, (n, k), device="cuda", dtype=torch.int8, generator=gen)
        w = T.PackedTernary.pack(w8, "2bit_tiles")
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        xq, x_scale = T.quantize_activations(x.float())
        ref = T.reference(xq.double(), w8, 1.0) / x_scale.double()[:, None]
        early, after = T.step22_w2a8(x, w), T.step22_w2a8(x, w, early=False)
        torch.cuda.synchronize()
        base = {"n": n, "k": k, "m": m}
        run.check("step 22 launched after = launched early, bit for bit", torch.equal(early, after), params=base)
        alone = matmul_alone(x, w)().clone()
        run.check("step 22's matmul alone = step 22, bit for bit", torch.equal(alone, early), params=base)
        err = ((early.double() - ref).abs().max() / ref.abs().max().clamp_min(1)).item()
        run.check("step 22 within 1e-5 of the float64 W2A8 reference (relative to the largest output)", err < 1e-5,
                  params=base, error=err)
        for variant in VARIANTS:
            if variant == "step 21" and m > 1:  # the anchor is timed at one row only
                continue

            def make_calls(variant=variant):
                fresh = torch.randn_like(x)
                return [call_of(variant, fresh, copy) for copy in run.rotated(w)]

            run.measure("step22_parts", make_calls, params=base | {"variant": variant},
                        weight_bytes=w.data.numel() * w.data.element_size())
        del w8, w
        torch.cuda.empty_cache()
    data = run.to_json()  # into lab/ternary/results/<gpu>/, and under $OUT where the run is on a lent machine
    for folder in [paths.LAB / "ternary" / "results"] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else []):
        out = write_lab_output(folder, run.device["name"], "step22_parts", data)
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    for r in run.rows:
        print(r["params"], f"{r['ms'] * 1e3:.2f} µs")
    return out


if __name__ == "__main__":
    main()
