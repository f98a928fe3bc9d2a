"""The Triton steps' tiles: the autotuner's configs on the GPU, small blocks in the interpreter, and what a launch
reports back (:class:`LaunchInfo`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton
from torch import Tensor

from studylog import runtime
from studylog.checks import check_choice

INTERPRETER_BLOCKS = (16, 16)  # small, so that tiny test sequences span several tiles
#: The tiles (``BLOCK_M`` query rows x ``BLOCK_N`` keys), warps and stages steps 4 and 5 are tuned over on the GPU.
GPU_CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in (
    (128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (64, 32, 4, 2), (64, 128, 4, 2),
    (128, 64, 8, 4), (64, 64, 4, 4), (64, 128, 4, 3), (128, 128, 8, 3))]
FEW_GPU_CONFIGS = [GPU_CONFIGS[0], GPU_CONFIGS[3]]  # steps 2 and 3 are way stations (each config is a compile)
#: fits in any dtype at head_dim 128 (float32: 32 KiB of q + 2 stages x 32 KiB of k and v)
SMALL_CONFIG = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)
#: the shared memory a config may plan for (an H100/H200 SM has 227 KiB): the big configs in float32 cannot fit
SMEM_BUDGET = 200 * 1024


def prune_configs(configs, named_args, **kwargs):
    """The configs whose shared memory (q, and the k, v and mask tiles in flight) fits :data:`SMEM_BUDGET`."""
    elem = named_args["Q"].element_size()
    head_dim = named_args["HEAD_DIM"] if "HEAD_DIM" in named_args else kwargs["HEAD_DIM"]

    def smem(cfg):  # q, then the tiles of k and v (and of step 2's mask) in flight: num_stages - 1 each
        bm, bn, stages = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_stages
        return (bm * head_dim + (stages - 1) * 2 * bn * head_dim) * elem + (stages - 1) * bm * bn

    return [cfg for cfg in configs if smem(cfg) <= SMEM_BUDGET] or [SMALL_CONFIG]


def tuned(configs, key=("HEAD_DIM",)):
    """On the GPU, autotune over ``configs`` per ``key`` (and dtype); in the interpreter, the kernel as it is."""
    def wrap(kernel):
        if runtime.mode() != "gpu":
            return kernel
        return triton.autotune(configs=configs, key=list(key),
                               prune_configs_by={"early_config_prune": prune_configs})(kernel)
    return wrap


def size_bucket(tokens: int) -> int:
    """Steps 4 and 5's autotuning key besides the head dim: sizes within a factor of two share one tuning."""
    return max(int(tokens), 1).bit_length()


@dataclass(frozen=True)
class LaunchInfo:
    """What a kernel step ran with, and (when asked) the key tiles each query tile visited."""

    block_m: int
    block_n: int
    tile_counts: list[list[int]] | None = None
    config: str = ""


def config_name(block_m: int, block_n: int, num_warps: int | None = None, num_stages: int | None = None) -> str:
    """``"64 x 64, 4 warps, 3 stages"``: how the benchmark names a config."""
    name = f"{block_m} x {block_n}"
    return name if num_warps is None else f"{name}, {num_warps} warps, {num_stages} stages"


def check_blocks(blocks: Any) -> None:
    """``blocks`` is ``None`` (autotune) or ``(BLOCK_M, BLOCK_N)``, powers of two from 16 to 128."""
    if blocks is not None and (not isinstance(blocks, (tuple, list)) or len(blocks) != 2
                               or not all(isinstance(b, int) and 16 <= b <= 128 and not b & (b - 1) for b in blocks)):
        raise ValueError(f"blocks must be (BLOCK_M, BLOCK_N), powers of two from 16 to 128, got {blocks!r}")


def config_names() -> list[str]:
    """The names (:func:`config_name`) of :data:`GPU_CONFIGS`, the configs a step can be pinned to."""
    return [config_name(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in GPU_CONFIGS]


def find_config(name: Any, blocks: Any = None) -> "triton.Config | None":
    """The config of :data:`GPU_CONFIGS` called ``name``, or ``None``; a step takes ``config`` or ``blocks``."""
    if name is None:
        return None
    if blocks is not None:
        raise ValueError("pass blocks or config, not both (a config fixes the blocks, warps and stages)")
    names = config_names()
    return GPU_CONFIGS[names.index(check_choice("config", name, names))]


def strides(*tensors: Tensor) -> list[int]:
    """The head and token strides of each tensor, in the order the kernels take them."""
    return [s for x in tensors for s in (x.stride(0), x.stride(1))]
