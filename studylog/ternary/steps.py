"""Chapter 5's table of steps (the one source of their names: function ``stepNN_<slug>``, series ``stepNN``),
the series renamed since, and the chapter's general entry point, :func:`ternary_matmul`."""

from __future__ import annotations

from typing import Optional

import torch
from jaxtyping import Float
from torch import Tensor

from studylog.chapter import Step
from studylog.paths import chapter_csrc
from studylog.ternary.cuda_steps import PROBES, step10_cuda_mma, step11_tma
from studylog.ternary.formats import PackedTernary, Scale
from studylog.ternary.triton_mma import (MMA_CONFIGS_FEW, MMA_CONFIGS_MANY, W2A8_CONFIGS, mma_2bit_kernel, step08_w2a8_dot,
                                         step09_mma, w2a8_dot_kernel)
from studylog.ternary.triton_steps import (DOT3_CONFIGS_FEW, DOT3_CONFIGS_MANY, DOT_CONFIGS_FEW, DOT_CONFIGS_MANY,
                                           GEMV3_CONFIGS, GEMV_CONFIGS, V1_CONFIGS, V3_CONFIGS, dot_2bit_kernel, dot_base3_kernel, gemv_2bit_kernel, gemv_base3_kernel,
                                           int8_v2_kernel, packed2_v3_kernel, sign_v1_kernel, step01_sign, step02_int8,
                                           step03_2bit, step04_gemv, step05_dot, step06_base3_gemv, step07_base3_dot)
from studylog.ternary.w2a8 import step12_w2a8, step13_w2a8_tiles

#: The chapter's CUDA C++ sources.
CSRC = chapter_csrc("ternary")

def ternary_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                   out: Optional[Tensor] = None) -> Float[Tensor, "*m n"]:
    """The chapter's general entry point: ``x @ W.T / scale`` for packed ternary ``W``, by the step made for
    its format. ``2bit_tiles``: step 11 (CUDA C++ on the TMA) up to 8 rows of x on Hopper GPUs and later,
    step 10 otherwise. The rule: step 11 keeps one row block of x per warp in flight, which fits up to 8 rows
    (its compiled shapes); beyond that step 10's MMA tiles take the work (the committed runs measure both at
    M = 1 and M = 16, the points the rule sits between; see the chapter's benchmark file); ``2bit_mma``: step 9 (bf16 or fp16 x);
    ``base3``: step 6 for one row of x, step 7 above; ``2bit``: step 4 for one row of x, step 5 above. (The
    W2A8 steps 8, 12 and 13 compute another product, of x quantised to int8: call them by name.)"""
    if isinstance(w, PackedTernary) and w.fmt == "2bit_tiles":
        few = isinstance(x, Tensor) and (x.ndim == 1 or (x.ndim == 2 and x.shape[0] <= 8))
        if few and x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9:
            return step11_tma(x, w, scale, out=out)
        return step10_cuda_mma(x, w, scale, out=out)
    if isinstance(w, PackedTernary) and w.fmt == "2bit_mma":
        return step09_mma(x, w, scale, out=out)
    one_row = isinstance(x, Tensor) and (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1))
    if isinstance(w, PackedTernary) and w.fmt == "base3":
        return (step06_base3_gemv if one_row else step07_base3_dot)(x, w, scale, out=out)
    return (step04_gemv if one_row else step05_dot)(x, w, scale, out=out)


STEPS = (
    Step(1, "sign", "dense weights, sign selection instead of a multiply", "triton", step01_sign, sign_v1_kernel),
    Step(2, "int8", "int8 weights", "triton", step02_int8, int8_v2_kernel),
    Step(3, "2bit", "2-bit packing, decoded with shifts and masks", "triton", step03_2bit, packed2_v3_kernel),
    Step(4, "gemv", "M = 1 made fast: wide tiles, split-K, a two-instruction decode", "triton", step04_gemv,
         gemv_2bit_kernel),
    Step(5, "dot", "batched x (M > 1): decoded weights into tl.dot", "triton", step05_dot, dot_2bit_kernel),
    Step(6, "base3_gemv", "1.6-bit packing (base 3, a table), the M = 1 kernel", "triton", step06_base3_gemv,
         gemv_base3_kernel),
    Step(7, "base3_dot", "1.6-bit packing, tl.dot", "triton", step07_base3_dot, dot_base3_kernel),
    Step(8, "w2a8_dot", "int8 activations (W2A8): int8 x int8 -> int32 on the tensor cores", "triton",
         step08_w2a8_dot, w2a8_dot_kernel),
    Step(9, "mma", "a 2-bit layout for the MMA: two weights an AND and a packed FMA", "triton", step09_mma,
         mma_2bit_kernel),
    Step(10, "cuda_mma", "the same bits in CUDA C++ on mma.sync, scheduled by hand", "cuda", step10_cuda_mma,
         CSRC / "ternary_mma.cu", "ternary_mma"),
    Step(11, "tma", "the weights brought by the copy engine (TMA), a producer warp", "cuda", step11_tma,
         CSRC / "ternary_bulk.cu", "ternary_bulk"),
    Step(12, "w2a8", "W2A8 on the int8 tensor cores, x quantised in the matmul", "cuda", step12_w2a8,
         CSRC / "ternary_w2a8.cu", "ternary_w2a8"),
    Step(13, "w2a8_tiles", "W2A8 for several rows of x, one tile a warp", "cuda", step13_w2a8_tiles,
         CSRC / "ternary_w2a8.cu", "ternary_w2a8_tiles"),
)

#: Where the series live: step number -> its benchmark series.
SERIES = {s.number: s.series for s in STEPS}

#: The series names of results measured before the steps had their names, by step.
_OLD_SERIES = {"v1_sign_bf16": 1, "v2_int8": 2, "v3_2bit": 3, "gemv_2bit": 4, "dot_2bit": 5, "gemv_base3": 6,
               "dot_base3": 7, "w2a8": 8, "mma_2bit": 9, "cuda_mma": 10, "bulk": 11, "w2a8_bulk": 12, "w2a8_tiles": 13}
#: Series of the results measured before the steps had their names: old -> new. (The series of the places to
#: quantise x that left the library, w2a8_bulk_first, _cluster and _per_warp, keep their names, unread.)
RENAMED_SERIES = {
    **{old: SERIES[n] for old, n in _OLD_SERIES.items()},
    "w2a8_bulk_every": f"{SERIES[12]}_every_block", "w2a8_bulk_staged": f"{SERIES[12]}_staged",
    "w2a8_bulk_2k": f"{SERIES[12]}_separate",
    **{f"bulk_probe_{p}": f"{SERIES[11]}_probe_{p}" for p in PROBES},
    **{f"w2a8_probe_{p}": f"{SERIES[12]}_probe_{p}" for p in PROBES},
    **{f"mma_2bit_cfg{i}": f"{SERIES[9]}_cfg{i}" for i in range(len(MMA_CONFIGS_FEW))},
}

#: The configs of each Triton step (their ``config=`` argument: ``config_dict(one of them)``; the tests and the
#: notebook run every one) and the weights each reads ("dense" float, "int8", or a PackedTernary format).
STEP_CONFIGS = {1: V1_CONFIGS, 2: V1_CONFIGS, 3: V3_CONFIGS, 4: GEMV_CONFIGS, 5: DOT_CONFIGS_FEW + DOT_CONFIGS_MANY,
                6: GEMV3_CONFIGS, 7: DOT3_CONFIGS_FEW + DOT3_CONFIGS_MANY, 8: W2A8_CONFIGS,
                9: MMA_CONFIGS_FEW + MMA_CONFIGS_MANY}
STEP_WEIGHTS = {1: "dense", 2: "int8", 3: "2bit", 4: "2bit", 5: "2bit", 6: "base3", 7: "base3", 8: "2bit", 9: "2bit_mma",
                10: "2bit_tiles", 11: "2bit_tiles", 12: "2bit_tiles", 13: "2bit_tiles"}
