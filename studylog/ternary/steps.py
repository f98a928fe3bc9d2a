"""Chapter 5's table of steps (the one source of their names: function ``stepNN_<slug>``, series ``stepNN``)
and the chapter's general entry point, :func:`ternary_matmul`."""

from __future__ import annotations

from typing import Optional

import torch
from jaxtyping import Float
from torch import Tensor

from studylog.chapter import Step
from studylog.paths import chapter_csrc
from studylog.ternary.cuda_steps import step10_cuda_mma, step11_tma
from studylog.ternary.formats import PackedTernary, Scale
from studylog.ternary.triton_mma import (MMA_CONFIGS_FEW, MMA_CONFIGS_MANY, W2A8_DOT_CONFIGS, step08_w2a8_dot,
                                         step08_w2a8_dot_kernel, step09_mma, step09_mma_kernel)
from studylog.ternary.triton_steps import (BASE3_DOT_CONFIGS_FEW, BASE3_DOT_CONFIGS_MANY, BASE3_GEMV_CONFIGS,
                                           DENSE_CONFIGS, DOT_CONFIGS_FEW, DOT_CONFIGS_MANY, GEMV_CONFIGS,
                                           TWO_BIT_CONFIGS, step01_sign, step01_sign_kernel, step02_int8,
                                           step02_int8_kernel, step03_2bit, step03_2bit_kernel, step04_gemv,
                                           step04_gemv_kernel, step05_dot, step05_dot_kernel, step06_base3_gemv,
                                           step06_base3_gemv_kernel, step07_base3_dot, step07_base3_dot_kernel)
from studylog.ternary.w2a8 import step12_w2a8, step13_w2a8_tiles

#: The chapter's CUDA C++ sources.
CSRC = chapter_csrc("ternary")

def ternary_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                   out: Optional[Tensor] = None) -> Float[Tensor, "*m n"]:
    """The chapter's general entry point: ``x @ W.T / scale`` for packed ternary ``W``, by the step made for its
    format. ``2bit_tiles``: step 11 up to 8 rows of x (its compiled shapes) on Hopper GPUs and later, else step
    10; ``2bit_mma``: step 9; ``base3``: step 6 for one row of x, else 7; ``2bit``: step 4 for one row, else 5.
    (The W2A8 steps 8, 12 and 13 compute another product, of x quantised to int8: call them by name.)"""
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
    Step(1, "sign", "dense weights, sign selection instead of a multiply", "triton", step01_sign,
         step01_sign_kernel),
    Step(2, "int8", "int8 weights", "triton", step02_int8, step02_int8_kernel),
    Step(3, "2bit", "2-bit packing, decoded with shifts and masks", "triton", step03_2bit, step03_2bit_kernel),
    Step(4, "gemv", "M = 1 made fast: wide tiles, split-K, a two-instruction decode", "triton", step04_gemv,
         step04_gemv_kernel),
    Step(5, "dot", "batched x (M > 1): decoded weights into tl.dot", "triton", step05_dot, step05_dot_kernel),
    Step(6, "base3_gemv", "1.6-bit packing (base 3, a table), the M = 1 kernel", "triton", step06_base3_gemv,
         step06_base3_gemv_kernel),
    Step(7, "base3_dot", "1.6-bit packing, tl.dot", "triton", step07_base3_dot, step07_base3_dot_kernel),
    Step(8, "w2a8_dot", "int8 activations (W2A8): int8 x int8 -> int32 on the tensor cores", "triton",
         step08_w2a8_dot, step08_w2a8_dot_kernel),
    Step(9, "mma", "a 2-bit layout for the MMA: two weights an AND and a packed FMA", "triton", step09_mma,
         step09_mma_kernel),
    Step(10, "cuda_mma", "the same bits in CUDA C++ on mma.sync, scheduled by hand", "cuda", step10_cuda_mma,
         CSRC / "ternary_mma.cu", "step10_cuda_mma_kernel"),
    Step(11, "tma", "the weights brought by the copy engine (TMA), a producer warp", "cuda", step11_tma,
         CSRC / "ternary_bulk.cu", "step11_tma_kernel"),
    Step(12, "w2a8", "W2A8 on the int8 tensor cores, x quantised in the matmul", "cuda", step12_w2a8,
         CSRC / "ternary_w2a8.cu", "step12_w2a8_kernel"),
    Step(13, "w2a8_tiles", "W2A8 for several rows of x, one tile a warp", "cuda", step13_w2a8_tiles,
         CSRC / "ternary_w2a8.cu", "step13_w2a8_tiles_kernel"),
)

#: Where the series live: step number -> its benchmark series.
SERIES = {s.number: s.series for s in STEPS}

#: The configs of each Triton step (their ``config=`` argument: ``config_dict(one of them)``; the tests and the
#: notebook run every one).
STEP_CONFIGS = {1: DENSE_CONFIGS, 2: DENSE_CONFIGS, 3: TWO_BIT_CONFIGS, 4: GEMV_CONFIGS,
                5: DOT_CONFIGS_FEW + DOT_CONFIGS_MANY, 6: BASE3_GEMV_CONFIGS,
                7: BASE3_DOT_CONFIGS_FEW + BASE3_DOT_CONFIGS_MANY, 8: W2A8_DOT_CONFIGS, 9: MMA_CONFIGS_FEW + MMA_CONFIGS_MANY}
