"""Chapter 5, steps 22 to 25 (``csrc/ternary_w2a8.cu``): W2A8, x quantised to int8 as BitNet b1.58 does it, exact
int32 sums on the int8 tensor cores fed by the TMA. Step 22 quantises x in a kernel of its own, step 23 inside the
matmul (:class:`Quant`); steps 24 and 25 take several rows of x, one tile of weights a warp."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any, Callable, Optional

import torch
import triton
from jaxtyping import Float, Int8, Int32
from torch import Tensor

from studylog import cuda, runtime
from studylog.checks import check_choice, check_int, check_tensor
from studylog.ternary.cuda_steps import (CUDA_WORKSPACE, PROBES, RING_BARRIER_BYTES, SMEM_LIMIT, RingConfig, TmaConfig,
                                         aligned_rows, cuda_call_args, require_hopper)
from studylog.ternary.formats import GROUP_WEIGHTS_2BIT, MMA_X_DTYPES, PackedTernary, Scale, SplitWorkspace, check_x

# Steps 22 and 23: x quantised to int8, then step 21's plumbing with the int8 MMA, one AND per 4 weights

#: (row_tiles, stages, chunk) of the compiled instances of steps 22 and 23.
W2A8_SHAPES = ((1, 4, 1), (2, 4, 1), (4, 4, 1), (1, 4, 2), (2, 4, 2), (1, 8, 1))
#: The same of the "staged" instances: deeper rings where shared memory allows (x is copied ahead of the weights).
W2A8_STAGED_SHAPES = ((1, 4, 1), (1, 8, 1), (2, 3, 1), (2, 4, 1), (4, 4, 1), (2, 8, 1), (4, 5, 1))


@dataclass(frozen=True)
class W2A8Config(TmaConfig):
    """A launch of steps 22 and 23: a :class:`~studylog.ternary.cuda_steps.TmaConfig` of their compiled shapes."""

    SHAPES = W2A8_SHAPES + tuple(s for s in W2A8_STAGED_SHAPES if s not in W2A8_SHAPES)


class Quant(IntEnum):
    """Where steps 22 and 23 quantise x: its QUANT in ternary_w2a8.cu (QUANT_* there, the same numbers)."""

    SEPARATE = 0  # in a kernel of its own before the matmul (quantize_x, the matmul launched early)
    EVERY_BLOCK = 1  # in every block of the matmul, from global memory (up to 8 rows of x, all of K in shared memory)
    STAGED = 2  # in every block, from a copy the copy engine brought into shared memory ahead of the weights


#: The places to quantise x by the name step 23's ``quantize`` takes.
W2A8_QUANTIZE = {"separate": Quant.SEPARATE, "every block": Quant.EVERY_BLOCK, "staged": Quant.STAGED}
_PLACE_NAMES = {quant: name for name, quant in W2A8_QUANTIZE.items()}


def _w2a8_instance(quant: Quant, bf16: bool, col_tiles: int, row_tiles: int, stages: int, chunk: int) -> str:
    return f"w2a8_kernel<{int(quant)}, {str(bf16).lower()}, {col_tiles}, {row_tiles}, {stages}, {chunk}>"


W2A8_QUANTIZE_INSTANCES = ("quantize_x<true>", "quantize_x<false>")
#: After quantize_x: 8 or 16 rows of x a block (16 only with 1 or 2 row tiles: 4 spill), x's type no
#: longer matters. Quantised in the matmul: 8 rows of x a block, bf16 or fp16.
W2A8_INSTANCES = tuple(_w2a8_instance(Quant.SEPARATE, True, mt, *shape) for mt in (1, 2) for shape in W2A8_SHAPES
                       if mt == 1 or shape[0] <= 2) + \
    tuple(_w2a8_instance(Quant.EVERY_BLOCK, bf16, 1, *shape) for bf16 in (True, False) for shape in W2A8_SHAPES) + \
    tuple(_w2a8_instance(Quant.STAGED, bf16, 1, *shape) for bf16 in (True, False) for shape in W2A8_STAGED_SHAPES)
cuda.declare_instances("ternary_w2a8", W2A8_QUANTIZE_INSTANCES + W2A8_INSTANCES)
W2A8_SIGNATURE = ["ptr"] * 9 + ["i32"] * 7
W2A8_QUANTIZE_SIGNATURE = ["ptr"] * 4 + ["i32"] * 3
#: The longest K steps 22 to 25 take: its int32 sums and their float32 conversion stay exact below it
#: (|sum_k x_k w_k| <= 128 K <= 2^24).
W2A8_MAX_K = 1 << 17


def w2a8_smem_bytes(cfg: RingConfig, x_rows: int, groups_per_slice: int, staged: bool = False) -> int:
    """Dynamic shared memory of a block of steps 22 to 25: mbarriers, stages, x (int8, or 16-bit when ``staged``)."""
    x_bytes = x_rows * groups_per_slice * 512 if staged else x_rows * (groups_per_slice * 256 + 64)
    return RING_BARRIER_BYTES + cfg.stages * cfg.stage_bytes + x_bytes


#: "staged" holds a row of x in registers (8 units of 16 a thread) before it writes int8 over it: groups a warp.
W2A8_STAGED_GROUPS_PER_WARP = 16


def w2a8_max_groups_per_slice(cfg: RingConfig, x_rows: int) -> int:
    """The longest slice of K (in groups of 256) whose int8 x fits beside the stages."""
    room = SMEM_LIMIT - RING_BARRIER_BYTES - cfg.stages * cfg.stage_bytes
    return max(1, (room // x_rows - 64) // 256)


@functools.lru_cache(maxsize=None)
def _w2a8_kernels(device_index: int, options: tuple = ()) -> tuple:
    """(quantize_x by bf16, {instance: kernel}) of ternary_w2a8.cu built with ``options`` (timeline: + the trace)."""
    module = cuda.load("ternary_w2a8", name_expressions=W2A8_QUANTIZE_INSTANCES + W2A8_INSTANCES + W2A8_TILES_INSTANCES,
                       device=device_index, options=options)
    traced = ["ptr"] if TIMELINE_OPTION in options else []
    quantize = {bf16: module.kernel(f"quantize_x<{'true' if bf16 else 'false'}>", W2A8_QUANTIZE_SIGNATURE + traced)
                for bf16 in (True, False)}
    kernels = {}
    for name in W2A8_INSTANCES + W2A8_TILES_INSTANCES:
        tiles = name in W2A8_TILES_INSTANCES
        kernels[name] = module.kernel(name, W2A8_TILES_SIGNATURE if tiles else W2A8_SIGNATURE + traced)
        kernels[name].set_max_dynamic_shared_memory(SMEM_LIMIT)
    return quantize, kernels


#: The build that stamps times into a trace (step23_timeline): 64 slots a block, then quantize_x's two at 120000.
TIMELINE_OPTION = "-DW2A8_TIMELINE=1"
TIMELINE_SLOTS = 1 << 17
TIMELINE_BLOCKS = 120000 // 64


def check_timeline_grid(grid: tuple) -> None:
    """Refuse a timeline launch of more blocks than the trace holds (they would stamp over quantize_x's slots)."""
    blocks = math.prod(grid)
    if blocks > TIMELINE_BLOCKS:
        raise ValueError(f"the timeline's trace holds {TIMELINE_BLOCKS} blocks of 64 slots, and this launch has "
                         f"{blocks} (grid {tuple(grid)}): time a smaller N, or a config with fewer slices of K")


#: Shared memory of one SM of the H100/H200 (blocks on an SM share it; each block also takes 1 KiB).
SM_SMEM_BYTES = 228 * 1024


def w2a8_config(m: int, n: int, k: int, sms: Optional[int] = None, quantize: Optional[str] = None) -> W2A8Config:
    """The launch of steps 22 and 23, 4 stages of 1 group. Every block: one tile and 8 warps up to two tiles an SM,
    else two (4 warps for K <= 8192); staged: the fewest row tiles that give 3/4 of the SMs a block; separate: the
    fewest that run in one wave; above 8 rows of x, 2 tiles and 8 warps."""
    if quantize is not None:
        check_choice("quantize", quantize, W2A8_QUANTIZE)
    sms = sms or runtime.sm_count()
    long_k = k > 8192
    if m > 8:
        return W2A8Config(row_tiles=2, warps=8, stages=4, chunk=1, slices=1)
    tiles, groups = triton.cdiv(n, 16), triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    quantize = quantize or w2a8_default_quantize(m, n, k, sms)
    if quantize == "staged":
        every = w2a8_config(m, n, k, sms, quantize="every block")
        for rt in (1, 2, 4):
            cfg = replace(every, row_tiles=rt)
            if 3 * sms <= 4 * triton.cdiv(tiles, rt) <= 4 * sms and \
                    w2a8_smem_bytes(cfg, m, groups, staged=True) <= SMEM_LIMIT:
                return cfg
        return every
    if quantize == "every block":
        few = tiles <= 2 * sms
        return W2A8Config(row_tiles=1 if few else 2, warps=8 if few or long_k else 4, stages=4, chunk=1, slices=1)
    warps = 8 if long_k else 4
    for rt in (1, 2, 4):
        cfg = W2A8Config(row_tiles=rt, warps=warps, stages=4, chunk=1, slices=1)
        if w2a8_smem_bytes(cfg, m, groups) <= SMEM_LIMIT and \
                triton.cdiv(tiles, rt) <= sms * w2a8_blocks_per_sm(cfg, m, groups):
            return cfg
    return W2A8Config(row_tiles=4, warps=warps, stages=4, chunk=1, slices=1)


def w2a8_blocks_per_sm(cfg: W2A8Config, x_rows: int, groups_per_slice: int, staged: bool = False) -> int:
    """Blocks of steps 22 and 23 one SM holds, by shared memory (1 KiB more a block) and by registers (96 a thread
    below four row tiles, where the launch bounds ask for two blocks an SM, else 136; a test checks it)."""
    smem = SM_SMEM_BYTES // (w2a8_smem_bytes(cfg, x_rows, groups_per_slice, staged=staged) + 1024)
    registers = 65536 // ((96 if cfg.row_tiles <= 2 else 136) * 32 * (cfg.warps + 1))
    return min(smem, registers)


def w2a8_quantize(x: Float[Tensor, "*m k"]) -> tuple[Int8[Tensor, "m kp"], Float[Tensor, " m"], Int32[Tensor, " m"]]:
    """Step 22's quantize_x: (xq (M, K padded to 256), x_scale, row_sum), bit for bit ``quantize_activations``'s."""
    x2, _ = check_x(x, None, dtypes=MMA_X_DTYPES)
    runtime.require_gpu("step 22's quantisation (CUDA C++ quantize_x)")
    return _quantize_x(aligned_rows(x2))


def _quantize_x(x2: Tensor, options: tuple = (), trace: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """quantize_x on checked x (2-D, rows on 16-byte boundaries; ``trace``: the timeline build's)."""
    m, k = x2.shape
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    xq = torch.empty(m, groups * GROUP_WEIGHTS_2BIT, dtype=torch.int8, device=x2.device)
    x_scale = torch.empty(m, dtype=torch.float32, device=x2.device)
    row_sum = torch.empty(m, dtype=torch.int32, device=x2.device)
    quantize, _ = _w2a8_kernels(x2.device.index or 0, options)
    traced = (trace,) if trace is not None else ()
    quantize[x2.dtype == torch.bfloat16]((m,), (1024,), x2, xq, x_scale, row_sum, k, x2.stride(0), groups, *traced)
    return xq, x_scale, row_sum


def step22_w2a8(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                out: Optional[Tensor] = None, config: Optional[W2A8Config] = None,
                early: bool = True) -> Float[Tensor, "*m n"]:
    """Step 22 (W2A8, Hopper and later): ``(x_q @ W.T) / (x_scale[:, None] * scale)``, x quantised by a kernel of its
    own, then step 21's ring on the int8 tensor cores, launched early (``early=False``: after quantize_x)."""
    return _w2a8_call(x, w, scale, out, config, "separate", step=22, early=early)()


def step23_w2a8_fused(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                      out: Optional[Tensor] = None, config: Optional[W2A8Config] = None,
                      quantize: Optional[str] = None) -> Float[Tensor, "*m n"]:
    """Step 23: step 22's product with x quantised inside the matmul, where it fits. ``quantize`` (None: the
    default): "staged" (the TMA brings x ahead of the weights; up to 8 rows, K <= 4096 x warps), "every block"
    (from global memory; up to 8 rows whose K fits in shared memory) or "separate" (step 22's launch)."""
    return _w2a8_call(x, w, scale, out, config, quantize)()


@dataclass(frozen=True)
class _Launch:
    """What a launch of steps 22 and 23 fixes for one shape: place, config, grid, kernels, K's groups."""

    quant: Quant
    cfg: W2A8Config
    grid: tuple
    block: tuple
    smem: int
    kernel: Any
    quantize_x: Any
    groups: int
    per_slice: int

    def args(self, x: Optional[Tensor], xq: Optional[Tensor], x_scale: Optional[Tensor], row_sum: Optional[Tensor],
             w: PackedTernary, z: Tensor, s: Tensor, partials: Optional[Tensor], counts: Optional[Tensor], m: int,
             x_stride: int, s_stride: int) -> tuple:
        """w2a8_kernel's arguments: x from quantize_x (``xq``, ``x_scale``, ``row_sum``) or x itself to quantise."""
        return (xq, x, w.data, z, s, x_scale, row_sum, partials, counts, m, w.n, w.k, self.groups, x_stride, s_stride,
                self.per_slice)


def _w2a8_launch(m: int, w: PackedTernary, bf16_x: bool, device: torch.device, config: Optional[W2A8Config],
                 quantize: Optional[str], build: tuple = ()) -> _Launch:
    """The :class:`_Launch` of steps 22 and 23 for M rows of x on ``w`` (checked), built with ``build``."""
    quant, cfg = w2a8_choose(m, w.n, w.k, config, quantize, runtime.sm_count())
    per_slice, grid = w2a8_grid(m, w.n, w.k, cfg, fused=quant != Quant.SEPARATE)
    col_tiles = 1 if m <= 8 else 2
    smem = w2a8_smem_bytes(cfg, min(m, 8 * col_tiles), per_slice, staged=quant == Quant.STAGED)
    quantize_x, kernels = _w2a8_kernels(device.index or 0, build)
    # (after quantize_x the matmul never sees x's type: one instance serves bf16 and fp16)
    kernel = kernels[_w2a8_instance(quant, bf16_x or quant == Quant.SEPARATE, col_tiles, cfg.row_tiles, cfg.stages,
                                    cfg.chunk)]
    return _Launch(quant, cfg, grid, (32 * (cfg.warps + 1),), smem, kernel, quantize_x[bf16_x],
                   -(-w.k // GROUP_WEIGHTS_2BIT), per_slice)


def _w2a8_call(x: Any, w: Any, scale: Any, out: Optional[Tensor], config: Any, quantize: Optional[str] = None,
               build: tuple = (), trace: Optional[Tensor] = None, step: int = 23,
               early: bool = True) -> Callable[[], Tensor]:
    """Steps 22 and 23 checked, as a launch to call; ``build``: a probe's or the timeline's options (and ``trace``)."""
    if quantize is not None:
        check_choice("quantize", quantize, W2A8_QUANTIZE)
    x2, vector, w, s, s_stride, z = _w2a8_args(x, w, scale, out, config, W2A8Config, step, "w2a8_kernel")
    m = x2.shape[0]
    launch = _w2a8_launch(m, w, x2.dtype == torch.bfloat16, x2.device, config, quantize, build)
    if trace is not None:
        check_timeline_grid(launch.grid)
    separate = launch.quant == Quant.SEPARATE  # (only its K is split: the fused launches take all of K)
    sums, counts = CUDA_WORKSPACE.get(x2.device, launch.grid[1] * m, w.n) if launch.grid[1] > 1 else (None, None)
    partials = sums.view(torch.int32) if sums is not None else None
    traced = (trace,) if trace is not None else ()

    def call() -> Tensor:
        # separate: x quantised by quantize_x, then the matmul launched early (programmatic dependent launch): its
        # weights stream in while x is quantised; fused: x itself, quantised in the matmul
        quantized = _quantize_x(x2, build, trace) if separate else (None, None, None)
        launch.kernel(launch.grid, launch.block, *launch.args(None if separate else x2, *quantized, w, z, s, partials,
                                                              counts, m, x2.stride(0), s_stride),
                      *traced, shared_mem=launch.smem, early=separate and early)
        return z[0] if vector else z
    return call


def _w2a8_args(x: Any, w: Any, scale: Any, out: Optional[Tensor], config: Any, config_type: type, step: int,
               kernel: str) -> tuple:
    """:func:`~studylog.ternary.cuda_steps.cuda_call_args`, then K and the GPU checked for step ``step``."""
    x2, vector, w, s, s_stride, z = cuda_call_args(x, w, scale, out, config, config_type,
                                                   f"step {step} (CUDA C++ {kernel})")
    if x2.shape[1] > W2A8_MAX_K:
        raise ValueError(f"step {step} takes K <= {W2A8_MAX_K} (its int32 sums stay exact below it), got "
                         f"K={x2.shape[1]}")
    require_hopper(x2.device, step)
    return x2, vector, w, s, s_stride, z


class W2A8Plan:
    """Step 23 for one layer, made once for an eager loop: ``plan = W2A8Plan(w, scale)``, then ``z = plan(x)``. The
    checks, choices, output and packed arguments that a call of :func:`step23_w2a8_fused` makes each time (more host
    time than its kernel takes) are made here once; a call checks x, writes its address and launches: the same bits.
    It returns ``plan.out`` ((m, N), or (N,) for ``m=None``), the same tensor every call: copy it to keep it. It
    launches on torch's current stream: two streams at once need two plans."""

    def __init__(self, w: PackedTernary, scale: Scale = 1.0, *, m: Optional[int] = 1,
                 dtype: torch.dtype = torch.bfloat16, quantize: Optional[str] = None):
        if m is not None:
            check_int("m", m, low=1)
        if dtype not in MMA_X_DTYPES:
            raise TypeError(f"dtype must be one of {[str(d) for d in MMA_X_DTYPES]}, got {dtype}")
        if not isinstance(w, PackedTernary):
            raise TypeError(f"w must be a PackedTernary in the 2bit_tiles format, got {type(w).__name__}")
        self.m, self.dtype, self.vector = m or 1, dtype, m is None
        # a zero x of the plan's shape, its rows 16-byte aligned (K padded to a multiple of 8): the checks of a call
        # of step 23 made once, on it; the plan then takes x whose rows lie the same way
        like = torch.zeros(self.m, -(-w.k // 8) * 8, dtype=dtype, device=w.data.device)[:, :w.k]
        x2, _, self.w, s, s_stride, self.out = _w2a8_args(like, w, scale, None, None, W2A8Config, 23, "w2a8_kernel")
        self.k, self.x_stride, self.device = w.k, x2.stride(0), x2.device
        launch = _w2a8_launch(self.m, w, dtype == torch.bfloat16, self.device, None, quantize)
        self.quant, self.config = launch.quant, launch.cfg
        separate = self.quant == Quant.SEPARATE  # quantize_x, then the matmul launched early (step 22's pair)
        # its own split-K scratch (zeros, restored by each launch) and quantised x: no other call shares them
        sums, counts = SplitWorkspace().get(self.device, launch.grid[1] * self.m, w.n) \
            if launch.grid[1] > 1 else (None, None)
        xq = (torch.empty(self.m, launch.groups * GROUP_WEIGHTS_2BIT, dtype=torch.int8, device=self.device),
              torch.empty(self.m, dtype=torch.float32, device=self.device),
              torch.empty(self.m, dtype=torch.int32, device=self.device)) if separate else (None,) * 3
        matmul = launch.kernel.bind(launch.grid, launch.block, *launch.args(
            None if separate else x2, *xq, w, self.out, s, None if sums is None else sums.view(torch.int32), counts,
            self.m, self.x_stride, s_stride), shared_mem=launch.smem, early=separate)
        self._launches = [matmul]
        if separate:
            self._launches.insert(0, launch.quantize_x.bind((self.m,), (1024,), x2, *xq, w.k, self.x_stride,
                                                            launch.groups))
        # the launch that reads x, and where: quantize_x's first argument, or the fused matmul's second
        self._x_slots = [(self._launches[0], 0 if separate else 1)]
        self._scale, self._aligned, self._scratch, self._quantized = s, x2, (sums, counts), xq  # what they read
        if self.vector:
            self.out = self.out[0]

    def __call__(self, x: Float[Tensor, "*m k"]) -> Float[Tensor, "*m n"]:
        if not isinstance(x, Tensor) or x.dtype != self.dtype or x.device != self.device:
            raise TypeError(f"x must be a {self.dtype} tensor on {self.device} (the plan's), got "
                            f"{getattr(x, 'dtype', type(x).__name__)} on {getattr(x, 'device', None)}")
        shape = (self.k,) if self.vector else (self.m, self.k)
        if x.shape != shape:
            raise ValueError(f"x must have the plan's shape {shape}, got {tuple(x.shape)}")
        # rows that do not lie as the kernel was packed for (16-byte aligned; more than one row: the plan's stride)
        # go through the plan's aligned copy first, as step 23 copies them
        if x.stride(-1) != 1 or (self.m > 1 and x.stride(0) != self.x_stride) or x.data_ptr() % 16:
            x = self._aligned.copy_(x.reshape(self.m, self.k))
        for launch, slot in self._x_slots:
            launch.set_pointer(slot, x)
        for launch in self._launches:
            launch()
        return self.out


@functools.lru_cache(maxsize=256)
def w2a8_grid(m: int, n: int, k: int, cfg: RingConfig, fused: bool = False) -> tuple[int, tuple[int, int, int]]:
    """(groups of K a block, grid) of steps 22 to 25: K in ``cfg.slices`` (more where x would not fit; none when
    ``fused``), 8 rows of x a block (16 above 8). Cached: on the host triton.cdiv costs more than a launch."""
    groups, col_tiles = triton.cdiv(k, GROUP_WEIGHTS_2BIT), 1 if m <= 8 else 2
    per_slice = groups if fused else \
        min(triton.cdiv(groups, cfg.slices), w2a8_max_groups_per_slice(cfg, min(m, 8 * col_tiles)))
    return per_slice, (triton.cdiv(n, cfg.rows), triton.cdiv(groups, per_slice), triton.cdiv(m, 8 * col_tiles))


def step23_probe(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale, probe: int) -> Callable[[], Tensor]:
    """As :func:`~studylog.ternary.cuda_steps.step21_probe`, for step 23 (x's quantisation kept in full)."""
    check_choice("probe", probe, PROBES)
    return _w2a8_call(x, w, scale, None, None, build=(f"-DW2A8_PROBE={int(probe)}",))


def step23_timeline(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale, trace: Tensor, *,
                    config: Optional[W2A8Config] = None, quantize: Optional[str] = None) -> Callable[[], Tensor]:
    """Step 23 built with its timeline, as a function to call: the same result, and each block's stamps in
    ``trace`` (int64, ``TIMELINE_SLOTS`` elements)."""
    check_tensor("trace", trace, dtype=torch.int64, shape=(TIMELINE_SLOTS,), contiguous=True,
                 like=x if isinstance(x, Tensor) else None)
    return _w2a8_call(x, w, scale, None, config, quantize, build=(TIMELINE_OPTION,), trace=trace)


# Where step 23 quantises x and its config: the defaults, and what a launch can take

def w2a8_refusal(m: int, k: int, quant: Quant, cfg: W2A8Config) -> Optional[str]:
    """Why steps 22 and 23 cannot launch ``cfg`` on M rows of x and K with x quantised at ``quant`` (None: they can)."""
    where = _PLACE_NAMES[quant]
    if quant != Quant.SEPARATE and m > 8:
        return f"quantize={where!r} quantises x in the matmul, at most 8 rows of x; M = {m}: use 'separate'"
    groups, col_tiles = triton.cdiv(k, GROUP_WEIGHTS_2BIT), 1 if m <= 8 else 2
    x_rows, staged = min(m, 8 * col_tiles), quant == Quant.STAGED
    if w2a8_smem_bytes(cfg, x_rows, 1) > SMEM_LIMIT:
        return (f"{cfg}: its stages ({cfg.stages} x {cfg.stage_bytes} bytes) leave no room for x in {SMEM_LIMIT} "
                "bytes of shared memory")
    if cfg.warps > 8:
        return f"{cfg}: steps 22 and 23 run at most 8 consumer warps a block (their launch bounds)"
    smem_x = w2a8_smem_bytes(cfg, x_rows, groups, staged)
    if quant != Quant.SEPARATE and smem_x > SMEM_LIMIT:
        what = f"quantize={where!r} needs all of K in shared memory, as 16-bit x," if staged else \
            "quantising in every block needs all of K in shared memory"
        return f"{cfg}: {what} beside the stages; M = {m}, K = {k} needs {smem_x} bytes, more than {SMEM_LIMIT}"
    if staged and groups > W2A8_STAGED_GROUPS_PER_WARP * cfg.warps:
        return (f"{cfg}: quantize='staged' holds a row of x in its consumers' registers: K <= "
                f"{W2A8_STAGED_GROUPS_PER_WARP * GROUP_WEIGHTS_2BIT * cfg.warps} with {cfg.warps} warps, got K = {k}")
    if staged and (cfg.row_tiles, cfg.stages, cfg.chunk) not in W2A8_STAGED_SHAPES:
        return f"{cfg}: quantize={where!r} is compiled for (row_tiles, stages, chunk) in {W2A8_STAGED_SHAPES} only"
    name = _w2a8_instance(quant, True, col_tiles, cfg.row_tiles, cfg.stages, cfg.chunk)
    if name not in W2A8_INSTANCES:  # (bf16 and fp16 x have the same compiled shapes)
        return (f"{cfg}: steps 22 and 23 have no compiled instance for it with quantize={where!r} and M = {m} "
                f"({name}); compiled: {W2A8_INSTANCES}")
    return None


def w2a8_takes(m: int, n: int, k: int, quantize: str, config: Optional[W2A8Config] = None,
               sms: Optional[int] = None) -> bool:
    """Whether step 23 takes the problem with x quantised at ``quantize``, with ``config`` (None: its own)."""
    cfg = config or w2a8_config(m, n, k, sms, quantize=quantize)
    return w2a8_refusal(m, k, W2A8_QUANTIZE[check_choice("quantize", quantize, W2A8_QUANTIZE)], cfg) is None


#: One row of x at least this long is staged (where every block's launch takes the problem too): a short row is read
#: by each block's own loads sooner than the copy engine's staged copy lands and lets the weights follow it. The
#: chapter's benchmark times the other place beside step 23 at every shape (`step23_every_block`, `step23_staged`).
W2A8_STAGED_MIN_K = 12288


def w2a8_default_quantize(m: int, n: int, k: int, sms: Optional[int] = None, staged: bool = True) -> str:
    """Where step 23 quantises x by default: "staged" for one long row of x (K >= :data:`W2A8_STAGED_MIN_K`) where it
    fits in no more waves than "every block" (a second wave costs more than the early copy of x saves), or where
    every block's launch does not take the problem; else "every block" where it fits, else "separate"."""
    every = w2a8_takes(m, n, k, "every block", sms=sms)
    if staged and m == 1 and w2a8_takes(m, n, k, "staged", sms=sms) and \
            (not every or (k >= W2A8_STAGED_MIN_K
                           and w2a8_waves(m, n, k, "staged", sms) <= w2a8_waves(m, n, k, "every block", sms))):
        return "staged"
    return "every block" if every else "separate"


def w2a8_waves(m: int, n: int, k: int, quantize: str, sms: Optional[int] = None) -> int:
    """Waves of step 23's fused launch (x quantised in the matmul) over the SMs, by the blocks an SM holds."""
    sms = sms or runtime.sm_count()
    cfg = w2a8_config(m, n, k, sms, quantize=quantize)
    grid = w2a8_grid(m, n, k, cfg, fused=True)[1]
    per_sm = w2a8_blocks_per_sm(cfg, min(m, 8), triton.cdiv(k, GROUP_WEIGHTS_2BIT), staged=quantize == "staged")
    return triton.cdiv(grid[0] * grid[1] * grid[2], sms * max(1, per_sm))


@functools.lru_cache(maxsize=256)
def w2a8_choose(m: int, n: int, k: int, config: Optional[W2A8Config] = None, quantize: Optional[str] = None,
                sms: Optional[int] = None) -> tuple[Quant, W2A8Config]:
    """(Quant, config) of step 23 for one shape, as asked or the defaults (a config that cannot stage x falls back
    to the next place); a ValueError says why one does not take the problem. Cached: a call only launches."""
    sms = sms or runtime.sm_count()
    where = quantize
    if where is None:
        where = w2a8_default_quantize(m, n, k, sms)
        if where == "staged" and config is not None and not w2a8_takes(m, n, k, "staged", config, sms):
            where = w2a8_default_quantize(m, n, k, sms, staged=False)
    quant = W2A8_QUANTIZE[check_choice("quantize", where, W2A8_QUANTIZE)]
    cfg = config or w2a8_config(m, n, k, sms, quantize=where)
    refusal = w2a8_refusal(m, k, quant, cfg)
    if refusal is not None:
        raise ValueError(refusal + ("" if quantize else " (no quantize given: the default for this config)"))
    return quant, cfg


# Steps 24 and 25: W2A8 for several rows of x, one tile of 16 weight rows a warp over a slice of K

#: (tiles a warp, stages, chunk) of the compiled instances of steps 24 and 25, the preferred first.
W2A8_TILES_SHAPES = ((1, 4, 2), (1, 2, 8), (1, 4, 4), (2, 4, 2))  # (2 tiles of 16 rows of x in 4 KiB stages spill)


@dataclass(frozen=True)
class W2A8TilesConfig(RingConfig):
    """A launch of steps 24 and 25: each warp owns ``tiles`` tiles of 16 weight rows."""

    TILES, WARPS, SHAPES = "tiles", (4, 8), W2A8_TILES_SHAPES
    warps: int = 4
    tiles: int = 1
    stages: int = 4
    chunk: int = 2
    slices: int = 1


def _w2a8_tiles_instance(col_tiles: int, warps: int, tiles: int, stages: int, chunk: int, x_tma: bool = True) -> str:
    return f"w2a8_tiles_kernel<{col_tiles}, {warps}, {tiles}, {stages}, {chunk}, {'true' if x_tma else 'false'}>"


#: 8 or 16 rows of x a block (grid.z: more), 4 or 8 warps, each compiled shape; x brought by the TMA (step 25)
#: or loaded by the consumer warps (step 24).
W2A8_TILES_INSTANCES = tuple(_w2a8_tiles_instance(mt, warps, *shape, x_tma) for x_tma in (True, False)
                             for mt in (1, 2) for warps in (4, 8) for shape in W2A8_TILES_SHAPES)
cuda.declare_instances("ternary_w2a8", W2A8_TILES_INSTANCES)
W2A8_TILES_SIGNATURE = ["ptr"] * 8 + ["i32"] * 5


@functools.lru_cache(maxsize=256)
def w2a8_tiles_config(m: int, n: int, k: int, sms: Optional[int] = None) -> W2A8TilesConfig:
    """The launch of steps 24 and 25: 4 warps, the first shape in the fewest waves, K sliced to fill the GPU once."""
    sms = sms or runtime.sm_count()
    groups, x_rows = triton.cdiv(k, GROUP_WEIGHTS_2BIT), min(m, 16)
    best = None
    for tiles, stages, chunk in W2A8_TILES_SHAPES:
        cfg = W2A8TilesConfig(4, tiles, stages, chunk, 1)
        column_blocks = triton.cdiv(n, cfg.rows) * triton.cdiv(m, 16 if m > 8 else 8)
        slices = max(triton.cdiv(groups, w2a8_max_groups_per_slice(cfg, x_rows)),
                     min(groups, max(1, sms // column_blocks)))
        per_slice = triton.cdiv(groups, slices)
        blocks = column_blocks * triton.cdiv(groups, per_slice)
        per_sm = SM_SMEM_BYTES // (w2a8_smem_bytes(cfg, x_rows, per_slice) + 1024)
        waves = triton.cdiv(blocks, sms * max(per_sm, 1))
        if best is None or waves < best[0]:
            best = (waves, replace(cfg, slices=slices))
    return best[1]


def step24_w2a8_tiles(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                      out: Optional[Tensor] = None, config: Optional[W2A8TilesConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 24 (W2A8, Hopper and later): step 22's product for 2 to 16 rows of x, each warp a tile of 16 weight
    rows over a slice of K, the block's slice of x loaded by its warps."""
    return _w2a8_tiles_call(x, w, scale, out, config, 24, x_tma=False)


def step25_x_tma(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                 out: Optional[Tensor] = None, config: Optional[W2A8TilesConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 25: step 24 with the block's slice of int8 x brought by the TMA (a second producer thread)."""
    return _w2a8_tiles_call(x, w, scale, out, config, 25, x_tma=True)


def _w2a8_tiles_call(x: Any, w: Any, scale: Any, out: Optional[Tensor], config: Optional[W2A8TilesConfig],
                     step: int, x_tma: bool) -> Tensor:
    """Steps 24 and 25: checks, quantize_x, then ``w2a8_tiles_kernel`` at ``x_tma``."""
    x2, vector, w, s, s_stride, z = _w2a8_args(x, w, scale, out, config, W2A8TilesConfig, step, "w2a8_tiles_kernel")
    m, k = x2.shape
    cfg = config or w2a8_tiles_config(m, w.n, k, runtime.sm_count())
    per_slice, grid = w2a8_grid(m, w.n, k, cfg)
    groups, col_tiles = -(-k // GROUP_WEIGHTS_2BIT), 1 if m <= 8 else 2
    smem = w2a8_smem_bytes(cfg, min(m, 8 * col_tiles), per_slice)
    kernel = _w2a8_kernels(x2.device.index or 0)[1][
        _w2a8_tiles_instance(col_tiles, cfg.warps, cfg.tiles, cfg.stages, cfg.chunk, x_tma)]
    sums, counts = CUDA_WORKSPACE.get(x2.device, grid[1] * m, w.n) if grid[1] > 1 else (None, None)
    partials = sums.view(torch.int32) if sums is not None else None
    xq, x_scale, row_sum = _quantize_x(x2)
    # launched early (programmatic dependent launch): its weights stream in while x is quantised
    kernel(grid, (32 * (cfg.warps + 1),), xq, w.data, z, s, x_scale, row_sum, partials, counts, m, w.n, groups,
           s_stride, per_slice, shared_mem=smem, early=True)
    return z[0] if vector else z
