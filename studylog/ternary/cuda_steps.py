"""Chapter 5, steps 15 to 21 in CUDA C++ on ``2bit_tiles`` weights and bf16 or fp16 x, each file one template: step
14's decode on ``mma.sync`` (``ternary_mma.cu``, 15 to 17), then the weights brought by the TMA (``ternary_bulk.cu``,
18 to 21). GPU only (on the CPU the wrappers check their inputs, then say so)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch
import triton
from jaxtyping import Float
from torch import Tensor

from studylog import cuda, runtime
from studylog.checks import check_choice, check_int
from studylog.ternary.formats import (GROUP_WEIGHTS_2BIT, MMA_X_DTYPES, PackedTernary, Scale, SplitWorkspace,
                                      check_packed_call)

# Steps 15 to 17: the same layout and decode in CUDA C++, on mma.sync

@dataclass(frozen=True)
class CudaMmaConfig:
    """A launch of steps 15 to 17: ``row_tiles`` tiles of 16 weight rows a warp, ``warps`` a block, ``stages`` groups
    in flight per thread, K cut into ``slices`` (more when x's slice would not fit in shared memory)."""

    row_tiles: int = 2
    stages: int = 2
    warps: int = 8
    slices: int = 1

    def __post_init__(self):
        if self.row_tiles not in (1, 2) or self.stages != 2:
            raise ValueError(f"row_tiles must be 1 or 2 and stages 2 (the compiled instances), "
                             f"got {self.row_tiles}, {self.stages}")
        check_choice("warps", self.warps, (1, 2, 4, 8))
        check_int("slices", self.slices, low=1)

    @property
    def rows(self) -> int:  # weight rows a block covers
        return 16 * self.row_tiles * self.warps


def _cuda_mma_instance(bf16: bool, col_tiles: int, row_tiles: int, stages: int, x_smem: bool) -> str:
    return f"cuda_mma_kernel<{str(bf16).lower()}, {col_tiles}, {row_tiles}, {stages}, {str(x_smem).lower()}>"


#: The instances of steps 15 to 17: bf16/fp16 x, 8 or 16 rows of x a block, 1 or 2 row tiles a warp, x from L2
#: (steps 15 and 16) or from shared memory (step 17).
CUDA_MMA_INSTANCES = tuple(_cuda_mma_instance(b, mt, rt, 2, xs) for xs in (True, False) for b in (True, False)
                           for mt in (1, 2) for rt in (1, 2))
CUDA_MMA_SIGNATURE = ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32", "i32", "i32", "i32", "i32"]
cuda.declare_instances("ternary_mma", CUDA_MMA_INSTANCES)


@functools.lru_cache(maxsize=None)
def _kernel(source: str, name: str, device_index: int, instances: tuple, options: tuple = ()) -> "cuda.CudaKernel":
    # Looked up once: compiling, loading and finding a kernel cost far more than the launch itself.
    module = cuda.load(source, name_expressions=instances, device=device_index, options=options)
    kernel = module.kernel(name, CUDA_MMA_SIGNATURE)
    if source == "ternary_bulk":  # steps 18 to 21 opt in to all of SMEM_LIMIT
        kernel.set_max_dynamic_shared_memory(SMEM_LIMIT)
    return kernel


def cuda_mma_config(m: int, n: int, k: int, sms: Optional[int] = None) -> CudaMmaConfig:
    """The launch of steps 16 and 17 (step 15 keeps K whole): up to 8 rows of x, 8 warps x 2 row tiles, K cut to
    about two blocks an SM; more, one row tile a warp, K cut only as far as x needs."""
    sms = sms or runtime.sm_count()
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    if m <= 8:
        row_blocks = triton.cdiv(n, 256)
        slices = round(2 * sms / max(row_blocks, 32))  # about 2 blocks a SM; 8 slices at most on 132 SMs
        return CudaMmaConfig(row_tiles=2, stages=2, warps=8, slices=max(1, min(groups, slices)))
    return CudaMmaConfig(row_tiles=1, stages=2, warps=8, slices=1)


#: Shared memory a block of step 17 may take for its copy of x (the most without opting in).
CUDA_MMA_SMEM_LIMIT = 48 * 1024


def cuda_mma_smem_bytes(x_rows: int, groups_per_slice: int) -> int:
    """Shared memory of a step-17 block: x_rows rows of x over one slice of K, 64 bytes of padding a row."""
    return x_rows * (groups_per_slice * 32 + 4) * 16


def cuda_mma_max_groups_per_slice(x_rows: int, room: int = CUDA_MMA_SMEM_LIMIT) -> int:
    """The longest slice of K (in groups of 256) whose copy of x (:func:`cuda_mma_smem_bytes`) fits in ``room``."""
    return max(1, (room // (16 * x_rows) - 4) // 32)


CUDA_WORKSPACE = SplitWorkspace()  # not step 14's: its sums must stay zeros, these need not


def cuda_call_args(x: Any, w: Any, scale: Any, out: Optional[Tensor], config: Any, config_type: type, what: str,
                   tma: bool = False):
    """Checks shared by steps 15 to 25 (on the CPU too): (x2 by :func:`aligned_rows`, vector, w, s, s_stride, z)."""
    x2, vector, w, s, s_stride, z = check_packed_call(x, w, scale, out, "2bit_tiles", dtypes=MMA_X_DTYPES)
    if w.data.data_ptr() % 16:
        raise ValueError("w.data must start on a 16-byte boundary (the kernel loads 16 bytes at a time)")
    if config is not None and type(config) is not config_type:  # (a W2A8Config is a TmaConfig too)
        raise TypeError(f"config must be a {config_type.__name__}, got {type(config).__name__}")
    runtime.require_gpu(what)
    return aligned_rows(x2, tma), vector, w, s, s_stride, z


def aligned_rows(x2: Tensor, tma: bool = False) -> Tensor:
    """x2, or a copy with rows zero-padded to a multiple of 8 where they are not 16-byte aligned or, with ``tma``, K is
    not a multiple of 8 (the kernels load, and the TMA copies, 16 bytes at a time)."""
    if x2.data_ptr() % 16 == 0 and (x2.stride(0) * x2.element_size()) % 16 == 0 and not (tma and x2.shape[1] % 8):
        return x2
    padded = torch.zeros(x2.shape[0], triton.cdiv(x2.shape[1], 8) * 8, dtype=x2.dtype, device=x2.device)
    padded[:, :x2.shape[1]] = x2
    return padded


def _cuda_mma_launch(x: Any, w: Any, scale: Any, out: Optional[Tensor], config: Optional[CudaMmaConfig],
                     step: int, x_smem: bool, whole_k: bool) -> Tensor:
    """Steps 15 to 17: ``cuda_mma_kernel`` at ``x_smem`` (None: :func:`cuda_mma_config`, K whole if ``whole_k``)."""
    x2, vector, w, s, s_stride, z = cuda_call_args(x, w, scale, out, config, CudaMmaConfig,
                                                   f"step {step} (CUDA C++ cuda_mma_kernel)")
    m, k = x2.shape
    cfg = config or cuda_mma_config(m, w.n, k)
    if config is None and whole_k:
        cfg = replace(cfg, slices=1)
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    col_tiles = 1 if m <= 8 else 2
    per_slice = triton.cdiv(groups, cfg.slices)
    if x_smem:  # (more slices than asked when x's slice would not fit in shared memory)
        per_slice = min(per_slice, cuda_mma_max_groups_per_slice(min(m, 8 * col_tiles)))
    slices = triton.cdiv(groups, per_slice)
    grid = (triton.cdiv(w.n, cfg.rows), slices, triton.cdiv(m, 8 * col_tiles))
    sums, counts = CUDA_WORKSPACE.get(x2.device, slices * m, w.n) if slices > 1 else (None, None)
    name = _cuda_mma_instance(x2.dtype == torch.bfloat16, col_tiles, cfg.row_tiles, cfg.stages, x_smem)
    kernel = _kernel("ternary_mma", name, x2.device.index or 0, CUDA_MMA_INSTANCES)
    kernel(grid, (32 * cfg.warps,), x2, w.data, z, s, sums, counts, m, w.n, k, groups, x2.stride(0), s_stride,
           per_slice, shared_mem=cuda_mma_smem_bytes(min(m, 8 * col_tiles), per_slice) if x_smem else 0)
    return z[0] if vector else z


def step15_cuda_mma(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                    out: Optional[Tensor] = None, config: Optional[CudaMmaConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 15: step 14's decode in CUDA C++ on ``mma.sync``, each thread loading its weights two groups ahead, x
    read from L2, K in one slice. Built for few rows of x (each 16 more re-decode the weights)."""
    return _cuda_mma_launch(x, w, scale, out, config, 15, x_smem=False, whole_k=True)


def step16_split_k(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                   out: Optional[Tensor] = None, config: Optional[CudaMmaConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 16: step 15 with K split across blocks, the partial sums added in a fixed order by the last to arrive."""
    return _cuda_mma_launch(x, w, scale, out, config, 16, x_smem=False, whole_k=False)


def step17_x_smem(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                  out: Optional[Tensor] = None, config: Optional[CudaMmaConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 17: step 16 with the block's slice of x copied once into shared memory, where its warps read it."""
    return _cuda_mma_launch(x, w, scale, out, config, 17, x_smem=True, whole_k=False)


# Steps 18 to 21: step 17's decode and MMAs, the weights brought into shared memory by the TMA

@dataclass(frozen=True)
class RingConfig:
    """What the launches of steps 18 to 25 share: ``warps`` consumer warps (plus a producer), tiles of 16 weight rows
    (the field ``TILES``), ``stages`` of ``chunk`` groups per warp and tile, ``slices`` of K; checked against
    the compiled ``SHAPES`` and ``WARPS``."""

    TILES, WARPS = "row_tiles", (1, 2, 4, 8, 16)

    def __post_init__(self):
        shape = (getattr(self, self.TILES), self.stages, self.chunk)
        if shape not in self.SHAPES:
            raise ValueError(f"({self.TILES}, stages, chunk) must be one of the compiled {self.SHAPES}, got {shape}")
        if self.warps not in self.WARPS:
            raise ValueError(f"warps must be {' or '.join(map(str, self.WARPS))} (the compiled instances), got "
                             f"{self.warps!r}")
        check_int("slices", self.slices, low=1)

    @property
    def stage_bytes(self) -> int:  # bytes of weights one stage holds
        return 1024 * self.warps * getattr(self, self.TILES) * self.chunk

    @property
    def rows(self) -> int:  # weight rows a block covers: its row tiles, or with TILES "tiles" each warp's own
        return 16 * getattr(self, self.TILES) * (self.warps if self.TILES == "tiles" else 1)


#: (row_tiles, stages, chunk) of the compiled step-21 instances (CHUNK 4 or 8, or RT 2 with CHUNK 4, would spill).
TMA_SHAPES = ((1, 4, 1), (1, 8, 1), (1, 4, 2), (1, 8, 2), (2, 4, 1), (2, 4, 2))


@dataclass(frozen=True)
class TmaConfig(RingConfig):
    """A launch of steps 18 to 21: a block owns ``row_tiles`` tiles of 16 weight rows; its warps split its K."""

    SHAPES = TMA_SHAPES
    row_tiles: int = 1
    warps: int = 8
    stages: int = 4
    chunk: int = 1
    slices: int = 1


#: Steps 18 to 20: the shapes :func:`tma_config` picks, 8 rows of x a block (more run in more blocks).
TMA_RING_SHAPES = ((1, 4, 1), (2, 4, 1))
#: (WARP_COPIES, MAGIC_REG) of ``tma_kernel`` at each step of the ring.
TMA_KNOBS = {18: (True, False), 19: (True, False), 20: (False, False), 21: (False, True)}


def _tma_instance(bf16: bool, col_tiles: int, row_tiles: int, stages: int, chunk: int, step: int = 21) -> str:
    knobs = ", ".join(str(knob).lower() for knob in TMA_KNOBS[step])  # WARP_COPIES, MAGIC_REG
    return f"tma_kernel<{str(bf16).lower()}, {col_tiles}, {row_tiles}, {stages}, {chunk}, {knobs}>"


TMA_INSTANCES = tuple(_tma_instance(b, mt, *shape) for b in (True, False) for mt in (1, 2) for shape in TMA_SHAPES)
#: Steps 18 and 19 (one knob setting) and 20.
TMA_RING_INSTANCES = tuple(_tma_instance(b, 1, *shape, step=step) for step in (19, 20) for b in (True, False)
                           for shape in TMA_RING_SHAPES)
cuda.declare_instances("ternary_bulk", TMA_INSTANCES + TMA_RING_INSTANCES)

#: Dynamic shared memory of a block of steps 18 to 25 (the H100/H200 allow 227 KiB, finish_split's static included).
SMEM_LIMIT = 224 * 1024
RING_BARRIER_BYTES = 512  # RING_BARRIER_BYTES in ternary_ring.cuh


def tma_smem_bytes(cfg: TmaConfig, x_rows: int, groups_per_slice: int) -> int:
    return RING_BARRIER_BYTES + cfg.stages * cfg.stage_bytes + cuda_mma_smem_bytes(x_rows, groups_per_slice)


def tma_max_groups_per_slice(cfg: TmaConfig, x_rows: int) -> int:
    """The longest slice of K (in groups of 256) whose copy of x fits beside the stages."""
    return cuda_mma_max_groups_per_slice(x_rows, SMEM_LIMIT - RING_BARRIER_BYTES - cfg.stages * cfg.stage_bytes)


def tma_config(m: int, n: int, k: int, sms: Optional[int] = None) -> TmaConfig:
    """The launch of steps 19 to 21 (18 splits K as 17 does), 4 stages of 1 group: one tile a block, 8 warps for
    K > 8192 (else 4); two tiles and 4 warps for long K and more than two tiles an SM; above 8 rows, two and 8."""
    sms = sms or runtime.sm_count()
    tiles = triton.cdiv(n, 16)
    if m > 8:
        return TmaConfig(row_tiles=2, warps=8, stages=4, chunk=1, slices=1)
    if tiles > 2 * sms and k > 8192:
        return TmaConfig(row_tiles=2, warps=4, stages=4, chunk=1, slices=1)
    return TmaConfig(row_tiles=1, warps=8 if k > 8192 else 4, stages=4, chunk=1, slices=1)


def _tma_step(x: Any, w: Any, scale: Any, out: Optional[Tensor], config: Optional[TmaConfig], step: int) -> Tensor:
    """Steps 18 to 21: ``tma_kernel`` at the step's knobs (None: :func:`tma_config`; step 18 with step 17's slices)."""
    x2, vector, w, s, s_stride, z = cuda_call_args(x, w, scale, out, config, TmaConfig,
                                                   f"step {step} (CUDA C++ tma_kernel)", tma=True)
    m, k = x2.shape
    require_hopper(x2.device, step)
    cfg = config or tma_config(m, w.n, k)
    if config is None and step == 18:
        cfg = replace(cfg, slices=cuda_mma_config(m, w.n, k).slices)
    _launch_tma(x2, w, s, s_stride, z, cfg, probe=0, step=step)
    return z[0] if vector else z


def step18_tma_ring(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                    out: Optional[Tensor] = None, config: Optional[TmaConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 18: step 17 with the weights copied into a ring of shared-memory stages by the TMA (a producer warp and
    mbarriers; Hopper and later), one copy a stage, tile and warp; K split as step 17 splits it."""
    return _tma_step(x, w, scale, out, config, 18)


def step19_shared_k(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                    out: Optional[Tensor] = None, config: Optional[TmaConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 19: step 18 with K in one slice: a block's warps share its K, their sums meet in shared memory."""
    return _tma_step(x, w, scale, out, config, 19)


def step20_tile_copies(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                       out: Optional[Tensor] = None, config: Optional[TmaConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 20: step 19 with one copy a stage and tile of 16 rows, not one a warp."""
    return _tma_step(x, w, scale, out, config, 20)


def step21_magic_reg(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                     out: Optional[Tensor] = None, config: Optional[TmaConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 21: step 20 with the decode's magic constant kept in one register (not rebuilt before each LOP3)."""
    return _tma_step(x, w, scale, out, config, 21)


def require_hopper(device: torch.device, step: int) -> None:
    """Steps 18 to 25 use the Tensor Memory Accelerator (cp.async.bulk): a Hopper GPU or later."""
    if torch.cuda.get_device_capability(device)[0] < 9:
        raise RuntimeError(f"step {step} uses the Tensor Memory Accelerator (cp.async.bulk): it needs a Hopper GPU "
                           f"or later (compute capability 9.0+), not {torch.cuda.get_device_name(device)}")


#: The probe builds of steps 21 and 23 (PROBE_* in ternary_common.cuh): the kernel with parts left out, to time what
#: limits it (2 decodes and multiplies whatever shared memory holds).
PROBES = {1: "copies only", 2: "arithmetic only", 3: "launch only"}


def step21_probe(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale, probe: int) -> Callable[[], Tensor]:
    """A step-21 launch with parts left out (a number of :data:`PROBES`), to time (its output means nothing)."""
    check_choice("probe", probe, PROBES)
    x2, _, w, s, s_stride, z = cuda_call_args(x, w, scale, None, None, TmaConfig, "a step-21 probe", tma=True)
    cfg = tma_config(x2.shape[0], w.n, x2.shape[1])
    return lambda: _launch_tma(x2, w, s, s_stride, z, cfg, probe=probe)


def _launch_tma(x2: Tensor, w: PackedTernary, s: Tensor, s_stride: int, z: Tensor, cfg: TmaConfig, probe: int,
                step: int = 21) -> Tensor:
    """Step ``step`` (18 to 21) on checked arguments; a ``probe`` other than 0: that BULK_PROBE build of step 21."""
    m, k = x2.shape
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    col_tiles = 1 if m <= 8 or step < 21 else 2
    if step < 21 and (cfg.row_tiles, cfg.stages, cfg.chunk) not in TMA_RING_SHAPES:
        raise ValueError(f"{cfg}: step {step} is compiled for (row_tiles, stages, chunk) in {TMA_RING_SHAPES} only")
    x_rows = min(m, 8 * col_tiles)
    if tma_smem_bytes(cfg, x_rows, 1) > SMEM_LIMIT:
        raise ValueError(f"{cfg}: its stages ({cfg.stages} x {cfg.stage_bytes} bytes) leave no room for x in "
                         f"{SMEM_LIMIT} bytes of shared memory")
    if cfg.warps > 8 and cfg.row_tiles * col_tiles > 1:
        raise ValueError(f"{cfg}: more than 8 warps a block only with one tile of W and 8 rows of x or fewer "
                         f"(the kernel's launch bounds); this call has {cfg.row_tiles} row tiles and M = {m}")
    per_slice = min(triton.cdiv(groups, cfg.slices), tma_max_groups_per_slice(cfg, x_rows))
    slices = triton.cdiv(groups, per_slice)
    grid = (triton.cdiv(w.n, cfg.rows), slices, triton.cdiv(m, 8 * col_tiles))
    sums, counts = CUDA_WORKSPACE.get(x2.device, slices * m, w.n) if slices > 1 else (None, None)
    name = _tma_instance(x2.dtype == torch.bfloat16, col_tiles, cfg.row_tiles, cfg.stages, cfg.chunk, step)
    options = (f"-DBULK_PROBE={int(probe)}",) if probe else ()
    instances = (name,) if probe else TMA_INSTANCES + TMA_RING_INSTANCES
    kernel = _kernel("ternary_bulk", name, x2.device.index or 0, instances, options)
    kernel(grid, (32 * (cfg.warps + 1),), x2, w.data, z, s, sums, counts, m, w.n, k, groups, x2.stride(0),
           s_stride, per_slice, shared_mem=tma_smem_bytes(cfg, x_rows, per_slice))
    return z


