"""Chapter 5's table of steps (the one source of their names: function ``stepNN_<slug>``, series ``stepNN``)
and the chapter's general entry point, :func:`ternary_matmul`."""

from __future__ import annotations

from typing import Optional

import torch
from jaxtyping import Float
from torch import Tensor

from studylog.chapter import Step
from studylog.ternary import triton_mma as TM
from studylog.ternary import triton_steps as TS
from studylog.ternary import w2a8 as W
from studylog.ternary.cuda_steps import (step15_cuda_mma, step16_split_k, step17_x_smem, step18_tma_ring,
                                         step19_shared_k, step20_tile_copies, step21_magic_reg)
from studylog.ternary.formats import PackedTernary, Scale
from studylog.ternary.sources import cuda_step_source, triton_step_source
from studylog.ternary.triton_mma import step14_workspace
from studylog.ternary.triton_steps import step05_gemv, step06_dot, step07_base3_gemv, step08_base3_dot


def ternary_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                   out: Optional[Tensor] = None) -> Float[Tensor, "*m n"]:
    """The chapter's general entry point: ``x @ W.T / scale`` for packed ternary ``W``, by the step made for its
    format. ``2bit_tiles``: step 21 up to 8 rows of x (its compiled shapes) on Hopper GPUs and later, else step
    17; ``2bit_mma``: step 14; ``base3``: step 7 for one row of x, else 8; ``2bit``: step 5 for one row, else 6.
    (The W2A8 steps 9 and 22 to 25 compute another product, of x quantised to int8: call them by name.)"""
    if isinstance(w, PackedTernary) and w.fmt == "2bit_tiles":
        few = isinstance(x, Tensor) and (x.ndim == 1 or (x.ndim == 2 and x.shape[0] <= 8))
        if few and x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9:
            return step21_magic_reg(x, w, scale, out=out)
        return step17_x_smem(x, w, scale, out=out)
    if isinstance(w, PackedTernary) and w.fmt == "2bit_mma":
        return step14_workspace(x, w, scale, out=out)
    one_row = isinstance(x, Tensor) and (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1))
    if isinstance(w, PackedTernary) and w.fmt == "base3":
        return (step07_base3_gemv if one_row else step08_base3_dot)(x, w, scale, out=out)
    return (step05_gemv if one_row else step06_dot)(x, w, scale, out=out)


_MMA_CU, _BULK_CU, _W2A8_CU = "ternary_mma.cu", "ternary_bulk.cu", "ternary_w2a8.cu"


def _pair(knobs: dict, launch) -> str:  # steps 11 to 13
    unmasked = (TM.pair_tiles_unmasked,) if knobs["NO_MASK"] else ()
    return triton_step_source((TM.pair_program, TM.pair_dot_kernel, *unmasked, TM.pair_step), knobs, launch)


def _mma(x_smem: bool, launch) -> str:  # steps 15 to 17
    return cuda_step_source(_MMA_CU, "cuda_mma_kernel", {"X_SMEM": x_smem}, launch,
                            helpers=() if x_smem else ("load_x_group_global",))


def _ring(warp_copies: bool, magic_reg: bool, launch) -> str:  # steps 18 to 21
    return cuda_step_source(_BULK_CU, "tma_kernel", {"WARP_COPIES": warp_copies, "MAGIC_REG": magic_reg}, launch,
                            helpers=("fill_per_warp",) if warp_copies else ())


STEPS = (
    Step(1, "sign", "dense weights, sign selection instead of a multiply", "triton", TS.step01_sign,
         triton_step_source((TS.dense_kernel,), {"FLOAT_W": True})),
    Step(2, "int8", "int8 weights", "triton", TS.step02_int8,
         triton_step_source((TS.dense_kernel,), {"FLOAT_W": False})),
    Step(3, "2bit", "2-bit packing, decoded with shifts and masks", "triton", TS.step03_2bit, TS.step03_2bit_kernel),
    Step(4, "and_decode", "the decode in one AND: a field under a float exponent", "triton", TS.step04_and_decode,
         TS.step04_and_decode_kernel),
    Step(5, "gemv", "M = 1: 8 rows a program, one load of x for the 8", "triton", step05_gemv, TS.step05_gemv_kernel),
    Step(6, "dot", "batched x (M > 1): decoded weights into tl.dot", "triton", step06_dot, TS.step06_dot_kernel),
    Step(7, "base3_gemv", "1.6-bit packing (base 3, a table), the M = 1 kernel", "triton", step07_base3_gemv,
         triton_step_source((TS.base3_fields, TS.step07_base3_gemv_kernel), {})),
    Step(8, "base3_dot", "1.6-bit packing, tl.dot", "triton", step08_base3_dot, TS.step08_base3_dot_kernel),
    Step(9, "w2a8_dot", "int8 activations (W2A8): int8 x int8 -> int32 on the tensor cores", "triton",
         TM.step09_w2a8_dot, TM.step09_w2a8_dot_kernel),
    Step(10, "dot_configs", "step 6's tl.dot at configs made for the tensor cores", "triton", TM.step10_dot_configs,
         triton_step_source((TS.step06_dot_kernel,), {}, TM.step10_dot_configs)),
    Step(11, "pair_decode", "two weights an AND and a packed FMA, on the 2bit layout", "triton",
         TM.step11_pair_decode, _pair({"NO_MASK": False, "MMA_LAYOUT": False}, TM.step11_pair_decode)),
    Step(12, "unmasked", "no masks in the loop: rows clamped, x unmasked below K", "triton", TM.step12_unmasked,
         _pair({"NO_MASK": True, "MMA_LAYOUT": False}, TM.step12_unmasked)),
    Step(13, "mma_layout", "the 2bit_mma layout: a word's two halves are K-neighbours", "triton", TM.step13_mma_layout,
         _pair({"NO_MASK": True, "MMA_LAYOUT": True}, TM.step13_mma_layout)),
    Step(14, "workspace", "split K through a zeroed workspace, no memset", "triton", step14_workspace,
         triton_step_source((TM.pair_program, TM.step14_workspace_kernel, TM.pair_tiles_unmasked, TM.pair_step),
                            {"NO_MASK": True, "MMA_LAYOUT": True}, step14_workspace)),
    Step(15, "cuda_mma", "the loop by hand in CUDA C++ on mma.sync, loads two groups ahead", "cuda",
         step15_cuda_mma, _mma(False, step15_cuda_mma)),
    Step(16, "split_k", "K split across blocks, the slices summed in a fixed order", "cuda", step16_split_k,
         _mma(False, step16_split_k)),
    Step(17, "x_smem", "x copied once into shared memory", "cuda", step17_x_smem, _mma(True, step17_x_smem)),
    Step(18, "tma_ring", "the weights brought by the copy engine (TMA) into a ring, a producer warp", "cuda",
         step18_tma_ring, _ring(True, False, step18_tma_ring)),
    Step(19, "shared_k", "the warps of a block share its K, their sums meet in shared memory", "cuda",
         step19_shared_k, _ring(True, False, step19_shared_k)),
    Step(20, "tile_copies", "one copy a stage and tile, not one a warp", "cuda", step20_tile_copies,
         _ring(False, False, step20_tile_copies)),
    Step(21, "magic_reg", "the decode's constant kept in a register", "cuda", step21_magic_reg,
         _ring(False, True, step21_magic_reg)),
    Step(22, "w2a8", "W2A8 on the int8 tensor cores, x quantised by a kernel of its own", "cuda", W.step22_w2a8,
         cuda_step_source(_W2A8_CU, "w2a8_kernel", {}, W.step22_w2a8)),
    Step(23, "w2a8_fused", "x quantised inside the matmul", "cuda", W.step23_w2a8_fused,
         cuda_step_source(_W2A8_CU, "w2a8_kernel", {}, W.step23_w2a8_fused)),
    Step(24, "w2a8_tiles", "several rows of x: one tile of weights a warp, a slice of K a block", "cuda",
         W.step24_w2a8_tiles, cuda_step_source(_W2A8_CU, "w2a8_tiles_kernel", {"X_TMA": False}, W.step24_w2a8_tiles)),
    Step(25, "x_tma", "x brought by the copy engine (TMA)", "cuda", W.step25_x_tma,
         cuda_step_source(_W2A8_CU, "w2a8_tiles_kernel", {"X_TMA": True}, W.step25_x_tma)),
)

#: Where the series live: step number -> its benchmark series.
SERIES = {s.number: s.series for s in STEPS}

#: The configs of each Triton step (``config=config_dict(one of them)``; the tests and the notebook run every one).
STEP_CONFIGS = {1: TS.DENSE_CONFIGS, 2: TS.DENSE_CONFIGS, 3: TS.TWO_BIT_CONFIGS, 4: TS.TWO_BIT_CONFIGS,
                5: TS.GEMV_CONFIGS, 6: TS.DOT_CONFIGS_FEW + TS.DOT_CONFIGS_MANY, 7: TS.BASE3_GEMV_CONFIGS,
                8: TS.BASE3_DOT_CONFIGS_FEW + TS.BASE3_DOT_CONFIGS_MANY, 9: TM.W2A8_DOT_CONFIGS,
                **{n: TM.DOT_MMA_CONFIGS_FEW + TM.DOT_MMA_CONFIGS_MANY for n in (10, 11, 12, 13)},
                14: TM.MMA_CONFIGS_FEW + TM.MMA_CONFIGS_MANY}
