"""Steps 7 to 10 of chapter 4: a first pass writes each frame's log-sum-exp and the target's emissions, alpha and
beta run side by side (a warp, or for step 10 a block of warps, per direction), and a last pass writes ``softmax -
posterior`` (steps 9 and 10: corrects the softmax the first pass wrote)."""

from __future__ import annotations

import math

from jaxtyping import Float, Int
from torch import Tensor

from studylog import checks, cuda
from studylog.ctc.launch import kernels, prepare_call, workspace_addresses, workspace_bytes
from studylog.ctc.targets import CTCTargets

#: Positions per lane compiled for step 7's warp recursion (even: a lane starts on a blank).
WARP_GRAINS = (2, 4, 6, 8, 10, 12, 16, 20, 24, 32)
#: Template options of the branch-free recursion of steps 8 and 9:
#: (frames of emissions prefetched, flush-to-zero ex2/lg2, warp maximum with redux.sync).
RECURSION_OPTIONS: dict[str, tuple[int, bool, bool]] = {
    "branch-free": (4, False, False),
    "+ ftz ex2/lg2": (4, True, False),
    "+ redux max": (4, True, True),
    "+ prefetch 8": (8, True, True),
}
#: The options steps 8 and 9 use unless told otherwise (flush-to-zero is exact enough for log-probabilities).
DEFAULT_RECURSION = "+ ftz ex2/lg2"
#: Positions per thread compiled for step 10's block recursion, and the one it uses by default.
BLOCK_GRAINS = (2, 4)
DEFAULT_BLOCK_GRAIN = 4
#: Most warps one direction of step 10 may use (the kernel's shared exchange has this many slots).
MAX_RECURSION_WARPS = 16
#: The ``.cu`` file (in ``studylog/ctc/csrc``) of each kernel of steps 7 to 10.
SOURCES = {"ctc_fused_stats": "ctc_step07_fused_softmax", "ctc_fused_recursion": "ctc_step07_fused_softmax",
           "ctc_fused_grad": "ctc_step07_fused_softmax", "ctc_branchless_recursion": "ctc_step08_branch_free",
           "ctc_stats_softmax": "ctc_step09_two_passes", "ctc_target_grad": "ctc_step09_two_passes",
           "ctc_warps_recursion": "ctc_step10_warps"}

_SIG_RECURSION = ["ptr"] * 6 + ["i32"] * 3
#: Signature of each kernel, by name without template arguments.
SIGNATURES = {"ctc_fused_stats": ["ptr"] * 6 + ["i32"] * 5, "ctc_fused_recursion": _SIG_RECURSION,
              "ctc_branchless_recursion": _SIG_RECURSION, "ctc_fused_grad": ["ptr"] * 13 + ["i32"] * 8,
              "ctc_stats_softmax": ["ptr"] * 7 + ["i32"] * 5, "ctc_target_grad": ["ptr"] * 13 + ["i32"] * 7,
              "ctc_warps_recursion": _SIG_RECURSION}


def source_of(kernel: str) -> str:
    """The ``.cu`` file stem that holds ``kernel`` (a name expression, template arguments or not)."""
    return SOURCES[kernel.split("<")[0]]


def warp_grain(max_positions: int) -> int:
    """Positions per lane for steps 7 to 9: the smallest compiled V with 32 V >= 2 L_max + 1."""
    for v in WARP_GRAINS:
        if 32 * v >= max_positions:
            return v
    raise ValueError(f"{max_positions} positions do not fit one warp (at most {32 * WARP_GRAINS[-1]})")


def check_recursion(recursion: str | None) -> str | None:
    return recursion if recursion is None else checks.check_choice("recursion", recursion, sorted(RECURSION_OPTIONS))


def recursion_name(v: int, option: str | None = None) -> str:
    """Name expression of the branch-free recursion (steps 8 and 9) with ``v`` positions per lane."""
    prefetch, ftz, redux = RECURSION_OPTIONS[check_recursion(option) or DEFAULT_RECURSION]
    checks.check_choice("positions per lane", v, WARP_GRAINS)
    return f"ctc_branchless_recursion<{v}, {prefetch}, {str(ftz).lower()}, {str(redux).lower()}>"


def fused_kernel_names(step: int, v: int, recursion: str | None = None) -> tuple[str, str, str]:
    """(first pass, recursion, last pass) of steps 7 to 10 with ``v`` positions per lane (thread)."""
    if step == 10:
        if recursion is not None:
            raise ValueError("step 10 has one recursion; recursion options apply to steps 8 and 9")
        if v not in BLOCK_GRAINS:
            raise ValueError(f"step 10 takes {BLOCK_GRAINS} positions per thread, got {v!r}")
        return "ctc_stats_softmax", f"ctc_warps_recursion<{v}>", "ctc_target_grad"
    if step == 7:
        if recursion is not None:
            raise ValueError("step 7 has one recursion; recursion options apply to steps 8 and 9")
        return "ctc_fused_stats", f"ctc_fused_recursion<{v}>", "ctc_fused_grad"
    if step == 8:
        return "ctc_fused_stats", recursion_name(v, recursion), "ctc_fused_grad"
    if step == 9:
        return "ctc_stats_softmax", recursion_name(v, recursion), "ctc_target_grad"
    raise ValueError(f"steps 7 to 10 have fused kernels; got step {step!r}")


def _load(names) -> list:
    out = []
    for name in names:
        (kernel,) = kernels(source_of(name), [(name, SIGNATURES[name.split("<")[0]])])
        out.append(kernel)
    return out


def preload_fused(step: int, grains, recursions=(None,)) -> None:
    """Compile ``grains`` of steps 7 to 10 (with the ``recursions`` of steps 8 and 9), one NVRTC call per source."""
    names = list(dict.fromkeys(n for v in grains for option in recursions for n in fused_kernel_names(step, v, option)))
    for source in dict.fromkeys(source_of(n) for n in names):
        kernels(source, [(n, SIGNATURES[n.split("<")[0]]) for n in names if source_of(n) == source])


def recursion_warps(max_positions: int, grain: int) -> int:
    """Warps per direction of step 10: enough for ``max_positions`` at ``grain`` positions per thread."""
    warps = math.ceil(max_positions / (32 * grain))
    if warps > MAX_RECURSION_WARPS:
        raise ValueError(f"{max_positions} positions need {warps} warps at {grain} per thread; "
                         f"at most {MAX_RECURSION_WARPS}")
    return warps


_LAUNCH: dict[tuple[int, int, str | None], list] = {}


def launch_shape(step: int, max_positions: int, grain: int | None = None) -> tuple[int, int]:
    """(positions per lane or thread ``v``, threads of one direction's recursion) of steps 7 to 10."""
    if step == 10:  # a block of warps per direction, ``v`` positions per thread
        v = DEFAULT_BLOCK_GRAIN if grain is None else grain
        return v, 32 * recursion_warps(max_positions, v)
    return warp_grain(max_positions), 32  # one warp per direction, ``v`` positions per lane


def scratch_sizes(T: int, N: int, label_stride: int, row_stride: int) -> list[int]:
    """Bytes of each scratch array of steps 7 to 10: row log-sum-exps, emissions, both directions' rows, offsets."""
    return [T * N * 4, N * T * (label_stride + 1) * 4, 2 * N * T * row_stride * 4, 2 * N * T * 8]


def scratch_bytes(step: int, T: int, N: int, label_stride: int, grain: int | None = None) -> int:
    """Bytes of a preallocated workspace for step ``step`` (7 to 10; see :class:`studylog.ctc.CTCPlan`)."""
    v, threads = launch_shape(step, 2 * label_stride + 1, grain)
    return workspace_bytes(scratch_sizes(T, N, label_stride, threads * v))


def launch(x: Tensor, batch: CTCTargets, loss: Tensor, grad: Tensor, zero_infinity: bool, step: int,
           recursion: str | None, grain: int | None = None, scratch: Tensor | None = None) -> None:
    """Launch step ``step`` (7 to 10) on checked inputs (nothing here is checked again)."""
    T, N, A = x.shape
    smax, lmax, umax = batch.max_positions, batch.label_stride, batch.slot_stride
    v, recursion_threads = launch_shape(step, smax, grain)
    row_stride = recursion_threads * v
    key = (step, v, recursion)
    launch = _LAUNCH.get(key)
    if launch is None:
        launch = _LAUNCH[key] = _load(fused_kernel_names(step, v, recursion))
    first, warp_recursion, last = launch
    vectorised = int(A % 4 == 0 and x.data_ptr() % 16 == 0 and grad.data_ptr() % 16 == 0)
    threads = 64 if A <= 512 else 256  # a frame of A activations per block
    buffer, (row_lse, emissions, rows, row_shift) = workspace_addresses(
        x.device, scratch_sizes(T, N, lmax, row_stride), scratch)
    labels, input_lengths, target_lengths = batch.labels, batch.input_lengths, batch.target_lengths
    if step >= 9:  # the softmax goes out with the statistics; the last pass corrects the target's classes
        first((T * N,), (threads,), x, labels, input_lengths, target_lengths, row_lse, emissions, grad,
              T, N, A, lmax, vectorised)
    else:
        first((T * N,), (threads,), x, labels, input_lengths, target_lengths, row_lse, emissions, T, N, A, lmax,
              vectorised)
    warp_recursion((N, 2), (recursion_threads,), emissions, labels, input_lengths, target_lengths, rows, row_shift,
                   T, N, lmax)
    if step >= 9:
        last((T * N,), (64 if smax <= 256 else 128,), x, row_lse, emissions, rows, row_shift, input_lengths,
             target_lengths, batch.slot_class, batch.slot_start, batch.slot_members, batch.num_slots, grad, loss,
             T, N, A, lmax, umax, row_stride, int(zero_infinity))
    else:
        last((T * N,), (threads,), x, row_lse, emissions, rows, row_shift, input_lengths, target_lengths,
             batch.slot_class, batch.slot_start, batch.slot_members, batch.num_slots, grad, loss,
             T, N, A, lmax, umax, row_stride, vectorised, int(zero_infinity))
    del buffer  # queued: the memory may be reused by the next allocation on this stream


def step07_fused_softmax(
    activations: Float[Tensor, "t n a"], targets: Int[Tensor, "..."] | CTCTargets, input_lengths=None,
    target_lengths=None, *, zero_infinity: bool = False, out_loss: Float[Tensor, " n"] | None = None,
    out_grad: Float[Tensor, "t n a"] | None = None,
) -> tuple[Float[Tensor, " n"], Float[Tensor, "t n a"]]:
    """Step 7: the softmax is never written out; one warp per utterance and direction runs alpha and beta at the
    same time, rows in registers. Arguments as :func:`step01_baseline`."""
    batch, loss, grad = prepare_call(activations, targets, input_lengths, target_lengths, out_loss, out_grad)
    launch(activations, batch, loss, grad, zero_infinity, 7, None)
    return loss, grad


def step08_branch_free(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                       recursion: str | None = None, out_loss=None, out_grad=None):
    """Step 8: step 7's warp recursion without its divergent branch; ``recursion`` (a key of
    ``RECURSION_OPTIONS``, ``DEFAULT_RECURSION`` when None) picks its template options."""
    recursion = check_recursion(recursion)
    batch, loss, grad = prepare_call(activations, targets, input_lengths, target_lengths, out_loss, out_grad)
    launch(activations, batch, loss, grad, zero_infinity, 8, recursion)
    return loss, grad


def step09_two_passes(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                      recursion: str | None = None, out_loss=None, out_grad=None):
    """Step 9: the first pass also writes the softmax as the gradient, the last only corrects the target's
    classes in place: the activations cross DRAM once. Arguments as :func:`step08_branch_free`."""
    recursion = check_recursion(recursion)
    batch, loss, grad = prepare_call(activations, targets, input_lengths, target_lengths, out_loss, out_grad)
    launch(activations, batch, loss, grad, zero_infinity, 9, recursion)
    return loss, grad


def step10_warps_per_direction(activations, targets, input_lengths=None, target_lengths=None, *,
                               zero_infinity=False, grain: int | None = None, out_loss=None, out_grad=None):
    """Step 10: step 9 with the recursion spread over a block of warps per direction, ``grain`` positions per
    thread (one of ``BLOCK_GRAINS``, ``DEFAULT_BLOCK_GRAIN`` when None)."""
    if grain is not None and grain not in BLOCK_GRAINS:
        raise ValueError(f"grain must be one of {BLOCK_GRAINS} for step 10, got {grain!r}")
    batch, loss, grad = prepare_call(activations, targets, input_lengths, target_lengths, out_loss, out_grad)
    launch(activations, batch, loss, grad, zero_infinity, 10, None, grain)
    return loss, grad


#: :func:`final_step`'s rule: step 10's warps per direction pay where many classes or a mid-size batch keep the GPU
#: busy; with few classes one utterance leaves them waiting on each other, and a full batch (FULL_BATCH or more)
#: keeps step 8's one warp per direction as busy. It must keep ``ctc_loss`` within the spread of the fastest step.
SMALL_ALPHABET = 1024
FULL_BATCH = 256


def final_step(max_time: int, batch_size: int, num_classes: int) -> int:
    """The step :func:`ctc_loss` runs for activations of this shape: 8 for a small alphabet with one utterance or a
    full batch, 10 otherwise (shapes only: no device synchronisation)."""
    if num_classes <= SMALL_ALPHABET and (batch_size == 1 or batch_size >= FULL_BATCH):
        return 8
    return 10


def ctc_loss(
    activations: Float[Tensor, "t n a"], targets: Int[Tensor, "..."] | CTCTargets, input_lengths=None,
    target_lengths=None, *, zero_infinity: bool = False, out_loss: Float[Tensor, " n"] | None = None,
    out_grad: Float[Tensor, "t n a"] | None = None,
) -> tuple[Float[Tensor, " n"], Float[Tensor, "t n a"]]:
    """The chapter's CTC loss: step 8 or step 10 with their defaults, as :func:`final_step` picks for the shape.

    Loss per utterance ``(N,)`` and the gradient of its sum w.r.t. the activations ``(T, N, A)``, softmax included.
    Arguments as :func:`step01_baseline`. With prepared targets a call can be captured in a CUDA graph; to replay
    one graph over batches whose targets change, use :class:`CTCPlan`.
    """
    shape = tuple(getattr(activations, "shape", ()))  # a bad shape goes on to step 10, whose checks name it
    step = step08_branch_free if len(shape) == 3 and final_step(*shape) == 8 else step10_warps_per_direction
    return step(activations, targets, input_lengths, target_lengths, zero_infinity=zero_infinity, out_loss=out_loss,
                out_grad=out_grad)


cuda.declare_instances(SOURCES["ctc_branchless_recursion"], [recursion_name(10, o) for o in RECURSION_OPTIONS])
cuda.declare_instances(SOURCES["ctc_warps_recursion"], [f"ctc_warps_recursion<{v}>" for v in BLOCK_GRAINS])
