"""Chapter 5: ternary (-1/0/+1) matmul, ``z = x @ W.T / scale``, in Triton (steps 1 to 9) then CUDA C++
(steps 10 to 13).

Every weight is -1, 0 or +1, as in BitNet b1.58. ``W`` is stored like an ``nn.Linear`` weight, ``(N, K)``;
``x`` is ``(M, K)`` (or a vector ``(K,)``); ``z`` is float32. Each step is a kernel next to the previous one,
so that the diff is the lesson; ``CHAPTER.steps`` lists them, each with its public function
``stepNN_<slug>`` and its benchmark series ``stepNN``:

* :mod:`~studylog.ternary.formats`: the packed layouts (:class:`PackedTernary`), BitNet's quantisation, the
  float64 reference and tolerance, the checks every wrapper runs;
* :mod:`~studylog.ternary.triton_steps`: steps 1 to 7 (dense weights, int8, 2-bit, M = 1, ``tl.dot``,
  base 3);
* :mod:`~studylog.ternary.triton_mma`: steps 8 (int8 activations) and 9 (a 2-bit layout for the MMA);
* :mod:`~studylog.ternary.cuda_steps`: steps 10 (``mma.sync`` by hand) and 11 (weights by the TMA);
* :mod:`~studylog.ternary.w2a8`: steps 12 and 13 (W2A8 in CUDA C++);
* :mod:`~studylog.ternary.peers`: GemLite and torch._int_mm on the same ternary weights (the peers);
  :mod:`~studylog.ternary.bitnet`: BitNet's own W2A8 GPU kernel, built from a local checkout of its repository;
* :mod:`~studylog.ternary.report`: the benchmark; :mod:`~studylog.ternary.results`: what reads its results
  (headline, targets; the figures are the book's, ``book.ternary.figures``);
* :mod:`~studylog.ternary.ops`: :func:`ternary_matmul` as a ``torch.library`` operator.

The lessons: ``notebooks/05_ternary_1_triton.ipynb`` (steps 1 to 9) and ``notebooks/05_ternary_2_cuda.ipynb``
(steps 10 to 13).

:func:`ternary_matmul` is the chapter's general entry point: it picks the step for the weights' format,
the rows of x and the GPU.
"""

from __future__ import annotations

from studylog.chapter import Chapter
from studylog.ternary.cuda_steps import (CUDA_MMA_INSTANCES, CUDA_MMA_SMEM_LIMIT, CUDA_WORKSPACE, PROBES,
                                         RING_BARRIER_BYTES, SMEM_LIMIT, TMA_INSTANCES, TMA_SHAPES, CudaMmaConfig,
                                         Probe, TmaConfig, cuda_mma_config, cuda_mma_max_groups_per_slice,
                                         cuda_mma_smem_bytes, step10_cuda_mma, step11_probe, step11_tma, tma_config,
                                         tma_max_groups_per_slice, tma_smem_bytes)
from studylog.ternary.formats import (FORMATS, FP32_TOLERANCE, GROUP_BYTES, GROUP_WEIGHTS_2BIT, GROUP_WEIGHTS_BASE3,
                                      GROUP_WORDS, INT32_FORMATS, MMA_X_DTYPES, TILE_ROWS, X_DTYPES, ZERO_BYTE,
                                      ZERO_WORD, PackedTernary, Scale, base3_table, base3_table_values,
                                      check_ternary_values, error_ratio, pack_2bit, pack_2bit_mma, pack_2bit_tiles,
                                      pack_base3, packed_cols, quantize_absmean, quantize_activations, reference,
                                      unpack_2bit, unpack_2bit_mma, unpack_2bit_tiles, unpack_base3)
from studylog.ternary.report import (BENCH_MS, BENCH_SHAPES, QUICK_CASES, bench, bench_cases, bench_series,
                                     place_series, probe_series, timing_plan)
from studylog.ternary.results import (BASELINES, FLOAT_X_SERIES, GEMLITE, INT_MM, INT_MM_MATMUL, W2A8_SERIES, fastest,
                                      headline, on_gpu_clock, series_label, shapes_in, target_checks)
from studylog.ternary.triton_mma import (BF16_HALF_BITS, FP16_ONE_BITS, MMA_CONFIGS_FEW, MMA_CONFIGS_MANY,
                                         SPLIT_WORKSPACE, W2A8_DOT_CONFIGS, pair_weights, step08_w2a8_dot,
                                         step08_w2a8_dot_kernel, step09_mma, step09_mma_kernel)
from studylog.ternary.triton_steps import (BASE3_DOT_CONFIGS_FEW, BASE3_DOT_CONFIGS_MANY, BASE3_GEMV_CONFIGS,
                                           DENSE_CONFIGS, DOT_CONFIGS_FEW, DOT_CONFIGS_MANY, GEMV_CONFIGS,
                                           TWO_BIT_CONFIGS, block_m_for, config_dict, step01_sign, step01_sign_kernel,
                                           step02_int8, step02_int8_kernel, step03_2bit, step03_2bit_kernel,
                                           step04_gemv, step04_gemv_kernel, step05_dot, step05_dot_kernel,
                                           step06_base3_gemv, step06_base3_gemv_kernel, step07_base3_dot,
                                           step07_base3_dot_kernel)
from studylog.ternary.w2a8 import (TIMELINE_SLOTS, W2A8_INSTANCES, W2A8_MAX_K, W2A8_QUANTIZE, W2A8_QUANTIZE_INSTANCES,
                                   W2A8_SHAPES, W2A8_STAGED_GROUPS_PER_WARP, W2A8_STAGED_SHAPES, W2A8_TILES_INSTANCES,
                                   W2A8_TILES_SHAPES, Quant, W2A8Config, W2A8TilesConfig, step12_probe, step12_timeline,
                                   step12_w2a8, step13_w2a8_tiles, w2a8_blocks_per_sm, w2a8_choose, w2a8_config,
                                   w2a8_default_quantize, w2a8_grid, w2a8_max_groups_per_slice, w2a8_quantize,
                                   w2a8_refusal, w2a8_smem_bytes, w2a8_takes, w2a8_tiles_config, w2a8_x_order)

from studylog.ternary import peers
from studylog.ternary.steps import CSRC, SERIES, STEP_CONFIGS, STEPS, ternary_matmul
from studylog.ternary import ops  # the entry point as a torch.library operator (torch.ops.studylog)

CHAPTER = Chapter(
    name="ternary",
    number=5,
    title="Ternary matmul: Triton, then CUDA C++ with MMA, TMA and int8 activations",
    notebooks=("05_ternary_1_triton", "05_ternary_2_cuda"),
    steps=STEPS,
    bench=bench,
    headline=headline,
    baselines=BASELINES,
)

#: What a reader imports after the two lessons. Everything else above stays an attribute of the package and is
#: reachable by its module (the configs and launches in cuda_steps, triton_steps, triton_mma and w2a8; the
#: benchmark in report; the reading of its results in results).
__all__ = [
    "CHAPTER", "ternary_matmul", "ops",
    # the steps
    "step01_sign", "step02_int8", "step03_2bit", "step04_gemv", "step05_dot", "step06_base3_gemv",
    "step07_base3_dot", "step08_w2a8_dot", "step09_mma", "step10_cuda_mma", "step11_tma", "step12_w2a8",
    "step13_w2a8_tiles",
    # the weights' formats, BitNet's quantisation, the reference
    "PackedTernary", "quantize_absmean", "quantize_activations", "reference", "error_ratio", "FP32_TOLERANCE",
    # the launches of the W2A8 steps (where x is quantised and the config a call takes; its grid)
    "w2a8_choose", "w2a8_grid",
    # the peers (GemLite, torch._int_mm), imported lazily
    "peers",
]
