"""Steps 7 to 14 of chapter 4: a first pass over the activations, the recursions, and the gradient a pass of its own."""

from __future__ import annotations

import math

from jaxtyping import Float, Int
from torch import Tensor

from studylog import checks, cuda
from studylog.ctc.launch import kernels, run_step, workspace_addresses, workspace_bytes
from studylog.ctc.targets import CTCTargets, prepare_targets
from studylog.ctc.warpctc import block_threads, default_grain

#: Positions per lane compiled for the warp recursions of steps 9 to 13 (even: a lane starts on a blank).
WARP_GRAINS = (2, 4, 6, 8, 10, 12, 16, 20, 24, 32)
#: Positions per thread compiled for the block recursion of steps 7 and 8: step 5's grain sizes.
THREAD_GRAINS = (1, 2, 3, 4, 5, 6, 7, 8)
#: Template options of the branch-free recursion of steps 11 to 13:
#: (frames of emissions prefetched, flush-to-zero ex2/lg2, warp maximum with redux.sync).
RECURSION_OPTIONS: dict[str, tuple[int, bool, bool]] = {
    "branch-free": (4, False, False),
    "+ ftz ex2/lg2": (4, True, False),
    "+ redux max": (4, True, True),
    "+ prefetch 8": (8, True, True),
}
#: The options of steps 12 and 13 unless told otherwise (flush-to-zero is exact enough for log-probabilities); the
#: last two options are experiments (lab/ctc).
DEFAULT_RECURSION = "+ ftz ex2/lg2"
#: Positions per thread compiled for step 14's block recursion, and the one it uses by default.
BLOCK_GRAINS = (2, 4)
DEFAULT_BLOCK_GRAIN = 4
#: Most warps one direction of step 14 may use (the kernel's shared exchange has this many slots).
MAX_RECURSION_WARPS = 16
#: Steps whose recursion runs alpha, then beta, on one block (7, 8) or one warp (9) per utterance: grid (N, 1).
IN_TURN = (7, 8, 9)
#: The ``.cu`` file (in ``studylog/ctc/csrc``) of each kernel of steps 7 to 14.
SOURCES = {**dict.fromkeys(("ctc_log_softmax_frames", "ctc_fused_stats", "ctc_block_recursion",
                            "ctc_warp_recursion_in_turn", "ctc_fused_recursion", "ctc_grad_from_log_softmax",
                            "ctc_fused_grad"), "ctc_step07_10_three_passes"),
           "ctc_branchless_recursion": "ctc_step11_12_branch_free",
           "ctc_stats_softmax": "ctc_step13_two_passes", "ctc_target_grad": "ctc_step13_two_passes",
           "ctc_warps_recursion": "ctc_step14_warps"}

_SIG_RECURSION = ["ptr"] * 6 + ["i32"] * 3
#: Signature of each kernel, by name without template arguments.
SIGNATURES = {"ctc_log_softmax_frames": ["ptr"] * 3 + ["i32"] * 3, "ctc_fused_stats": ["ptr"] * 6 + ["i32"] * 5,
              "ctc_block_recursion": _SIG_RECURSION + ["i32"],
              "ctc_warp_recursion_in_turn": _SIG_RECURSION, "ctc_fused_recursion": _SIG_RECURSION,
              "ctc_grad_from_log_softmax": ["ptr"] * 12 + ["i32"] * 8, "ctc_fused_grad": ["ptr"] * 13 + ["i32"] * 8,
              "ctc_stats_softmax": ["ptr"] * 7 + ["i32"] * 5, "ctc_target_grad": ["ptr"] * 13 + ["i32"] * 7,
              "ctc_branchless_recursion": _SIG_RECURSION, "ctc_warps_recursion": _SIG_RECURSION}


def source_of(kernel: str) -> str:
    """The ``.cu`` file stem that holds ``kernel`` (a name expression, template arguments or not)."""
    return SOURCES[kernel.split("<")[0]]


def warp_grain(max_positions: int) -> int:
    """Positions per lane for steps 9 to 13: the smallest compiled V with 32 V >= 2 L_max + 1."""
    for v in WARP_GRAINS:
        if 32 * v >= max_positions:
            return v
    raise ValueError(f"{max_positions} positions do not fit one warp (at most {32 * WARP_GRAINS[-1]})")


def check_recursion(recursion: str | None) -> str | None:
    return recursion if recursion is None else checks.check_choice("recursion", recursion, sorted(RECURSION_OPTIONS))


def recursion_name(v: int, option: str | None = None) -> str:
    """Name expression of the branch-free recursion (steps 11 to 13) with ``v`` positions per lane and ``option``."""
    prefetch, ftz, redux = RECURSION_OPTIONS[check_recursion(option) or DEFAULT_RECURSION]
    checks.check_choice("positions per lane", v, WARP_GRAINS)
    return f"ctc_branchless_recursion<{v}, {prefetch}, {str(ftz).lower()}, {str(redux).lower()}>"


def fused_kernel_names(step: int, v: int, recursion: str | None = None) -> tuple[str, ...]:
    """(first pass, recursion, last pass) of steps 7 to 14 with ``v`` positions per thread or lane; ``recursion``:
    steps 12 and 13's option."""
    if recursion is not None and step not in (12, 13):
        raise ValueError(f"step {step} has one recursion; recursion options apply to steps 12 and 13")
    if step in (7, 8):  # step 5's block, ``v`` positions per thread; step 7 gathers from the log-softmax
        checks.check_choice("positions per thread", v, THREAD_GRAINS)
        if step == 7:
            return "ctc_log_softmax_frames", f"ctc_block_recursion<{v}, true>", "ctc_grad_from_log_softmax"
        return "ctc_fused_stats", f"ctc_block_recursion<{v}, false>", "ctc_fused_grad"
    if step == 14:
        if v not in BLOCK_GRAINS:
            raise ValueError(f"step 14 takes {BLOCK_GRAINS} positions per thread, got {v!r}")
        return "ctc_stats_softmax", f"ctc_warps_recursion<{v}>", "ctc_target_grad"
    checks.check_choice("positions per lane", v, WARP_GRAINS)
    if step == 9:
        return "ctc_fused_stats", f"ctc_warp_recursion_in_turn<{v}>", "ctc_fused_grad"
    if step == 10:
        return "ctc_fused_stats", f"ctc_fused_recursion<{v}>", "ctc_fused_grad"
    if step in (11, 12):
        return "ctc_fused_stats", recursion_name(v, "branch-free" if step == 11 else recursion), "ctc_fused_grad"
    if step == 13:
        return "ctc_stats_softmax", recursion_name(v, recursion), "ctc_target_grad"
    raise ValueError(f"steps 7 to 14 have fused kernels; got step {step!r}")


def _wanted(names) -> list[tuple[str, list[str]]]:
    return [(n, SIGNATURES[n.split("<")[0]]) for n in names]


def preload_fused(step: int, grains, recursions=(None,)) -> None:
    """Compile ``grains`` (and ``recursions``) of step ``step`` (7 to 14), one NVRTC call per source."""
    names = list(dict.fromkeys(n for v in grains for r in recursions for n in fused_kernel_names(step, v, r)))
    for source in dict.fromkeys(source_of(n) for n in names):
        kernels(source, _wanted(n for n in names if source_of(n) == source))


def recursion_warps(max_positions: int, grain: int) -> int:
    """Warps per direction of step 14: enough for ``max_positions`` at ``grain`` positions per thread."""
    warps = math.ceil(max_positions / (32 * grain))
    if warps > MAX_RECURSION_WARPS:
        raise ValueError(f"{max_positions} positions need {warps} warps at {grain} per thread; "
                         f"at most {MAX_RECURSION_WARPS}")
    return warps


#: The (first pass, recursion, last pass) kernels of each (step, v, recursion) launched so far, loaded once.
LAUNCHES: dict[tuple[int, int, str | None], list] = {}


def launch_shape(step: int, max_positions: int, grain: int | None = None) -> tuple[int, int]:
    """(positions per lane or thread ``v``, threads of one direction's recursion) of steps 7 to 14."""
    if step in (7, 8):  # step 5's block: warp-ctc's grain rule, about 128 threads an utterance
        v = default_grain(max_positions)
        return v, block_threads(max_positions, v)
    if step == 14:  # a block of warps per direction, ``v`` positions per thread
        v = DEFAULT_BLOCK_GRAIN if grain is None else grain
        return v, 32 * recursion_warps(max_positions, v)
    return warp_grain(max_positions), 32  # one warp per direction, ``v`` positions per lane


def scratch_sizes(step: int, T: int, N: int, A: int, label_stride: int, row_stride: int) -> list[int]:
    """Bytes of each scratch array of step ``step``: the log-softmax (7) or the row log-sum-exps and emissions, then
    both directions' rows and their offsets."""
    rows = [2 * N * T * row_stride * 4, 2 * N * T * 8]
    return ([T * N * A * 4] if step == 7 else [T * N * 4, N * T * (label_stride + 1) * 4]) + rows


def scratch_bytes(step: int, T: int, N: int, A: int, label_stride: int) -> int:
    """Bytes of a preallocated workspace for step ``step`` (7 to 14; see :class:`studylog.ctc.CTCPlan`)."""
    v, threads = launch_shape(step, 2 * label_stride + 1)
    return workspace_bytes(scratch_sizes(step, T, N, A, label_stride, threads * v))


def launch(x: Tensor, batch: CTCTargets, loss: Tensor, grad: Tensor, zero_infinity: bool, step: int,
           recursion: str | None = None, grain: int | None = None, scratch: Tensor | None = None) -> None:
    """Launch step ``step`` (7 to 14) on checked inputs (nothing here is checked again)."""
    T, N, A = x.shape
    smax, lmax, umax = batch.max_positions, batch.label_stride, batch.slot_stride
    v, recursion_threads = launch_shape(step, smax, grain)
    row_stride = recursion_threads * v
    key = (step, v, recursion)
    if key not in LAUNCHES:
        LAUNCHES[key] = [kernels(source_of(n), _wanted([n]))[0] for n in fused_kernel_names(step, v, recursion)]
    first, recursion_kernel, last = LAUNCHES[key]
    vectorised = int(A % 4 == 0 and x.data_ptr() % 16 == 0 and grad.data_ptr() % 16 == 0)
    threads = 64 if A <= 512 else 256  # a frame of A activations per block
    buffer, addresses = workspace_addresses(x.device, scratch_sizes(step, T, N, A, lmax, row_stride), scratch)
    labels, input_lengths, target_lengths = batch.labels, batch.input_lengths, batch.target_lengths
    slots = (batch.slot_class, batch.slot_start, batch.slot_members, batch.num_slots)
    grid = (N, 1) if step in IN_TURN else (N, 2)  # alpha, then beta; or alpha's warp (block) and beta's side by side
    if step == 7:  # the log-softmax written whole: the recursion gathers its emissions from it, the last pass reads it
        log_probs, rows, row_shift = addresses
        first((T * N,), (threads,), x, input_lengths, log_probs, N, A, vectorised)
        emissions, last_reads = log_probs, (log_probs, rows, row_shift, input_lengths, target_lengths, labels)
    else:
        row_lse, emissions, rows, row_shift = addresses
        softmax = (grad,) if step >= 13 else ()  # the softmax goes out with the statistics from step 13 on
        first((T * N,), (threads,), x, labels, input_lengths, target_lengths, row_lse, emissions, *softmax,
              T, N, A, lmax, vectorised)
        last_reads = (x, row_lse, emissions, rows, row_shift, input_lengths, target_lengths)
    block_recursion = (A,) if step in (7, 8) else ()  # their block recursion: step 7's gathers from the log-softmax
    recursion_kernel(grid, (recursion_threads,), emissions, labels, input_lengths, target_lengths, rows, row_shift,
                     T, N, lmax, *block_recursion)
    # from step 13 the last pass only corrects the target's classes in the softmax the first wrote: no vector flag
    last_threads, vector_flag = (64 if smax <= 256 else 128, ()) if step >= 13 else (threads, (vectorised,))
    last((T * N,), (last_threads,), *last_reads, *slots, grad, loss, T, N, A, lmax, umax, row_stride, *vector_flag,
         int(zero_infinity))
    del buffer  # queued: the memory may be reused by the next allocation on this stream


def step07_gradient_pass(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                         out_loss=None, out_grad=None):
    """Step 7: the gradient a pass of its own, a block per frame, after alpha then beta on a block per utterance
    (step 5's grain) write every row. Arguments as :func:`step01_baseline`."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad, zero_infinity, 7)


def step08_fused_softmax(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                         out_loss=None, out_grad=None):
    """Step 8: step 7 with no softmax written: the first pass keeps each frame's log-sum-exp and the target's
    emissions, the last recomputes the softmax."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad, zero_infinity, 8)


def step09_one_warp(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                    out_loss=None, out_grad=None):
    """Step 9: step 8's recursion on one warp per utterance, positions in registers, neighbours by shuffles."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad, zero_infinity, 9)


def step10_side_by_side(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                        out_loss=None, out_grad=None):
    """Step 10: step 9 with alpha's warp and beta's side by side."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad, zero_infinity, 10)


def step11_branch_free(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                       out_loss=None, out_grad=None):
    """Step 11: step 10's warp recursion without its divergent branch."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad, zero_infinity, 11)


def step12_flush_to_zero(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                         recursion: str | None = None, out_loss=None, out_grad=None):
    """Step 12: step 11's recursion with flush-to-zero ``ex2``/``lg2``; ``recursion``: a key of
    ``RECURSION_OPTIONS`` (``DEFAULT_RECURSION`` when None)."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad,
                    zero_infinity, 12, check_recursion(recursion))


def step13_two_passes(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                      recursion: str | None = None, out_loss=None, out_grad=None):
    """Step 13: the first pass also writes the softmax as the gradient, the last corrects the target's classes in
    place: the activations cross DRAM once."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad,
                    zero_infinity, 13, check_recursion(recursion))


def step14_warps_per_direction(activations, targets, input_lengths=None, target_lengths=None, *,
                               zero_infinity=False, grain: int | None = None, out_loss=None, out_grad=None):
    """Step 14: step 13 with the recursion spread over a block of warps per direction, ``grain`` positions per
    thread (one of ``BLOCK_GRAINS``, ``DEFAULT_BLOCK_GRAIN`` when None)."""
    if grain is not None and grain not in BLOCK_GRAINS:
        raise ValueError(f"grain must be one of {BLOCK_GRAINS} for step 14, got {grain!r}")
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad,
                    zero_infinity, 14, None, grain)


#: :func:`final_step`'s rule (``lab/ctc/length_rule.py`` sets it). What decides is the row of alpha, ``2 L_max + 1``
#: positions: where it fits one warp at 4 positions a lane, one warp a direction is fastest (step 14's extra warps only
#: add barriers): step 13 where many classes make its softmax pass pay, else step 12. Longer rows go to step 14's
#: several warps, except a full batch of few classes, whose utterances alone fill the GPU: it stays on step 12 while
#: a row fits one warp at step 12's grain of 10. It must keep ``ctc_loss`` within the spread of the fastest step.
SMALL_ALPHABET = 1024
FULL_BATCH = 256
ONE_WARP_POSITIONS = 32 * 4
FULL_BATCH_POSITIONS = 32 * 10


def final_step(max_time: int, batch_size: int, num_classes: int, max_positions: int) -> int:
    """The step :func:`ctc_loss` runs for activations of this shape and targets whose longest row of alpha has
    ``max_positions`` entries (``CTCTargets.max_positions``: host values, no synchronisation)."""
    for name, value in (("max_time", max_time), ("batch_size", batch_size), ("num_classes", num_classes),
                        ("max_positions", max_positions)):
        checks.check_int(name, value, low=1)
    if max_positions <= ONE_WARP_POSITIONS:
        return 13 if num_classes > SMALL_ALPHABET else 12
    if num_classes <= SMALL_ALPHABET and batch_size >= FULL_BATCH and max_positions <= FULL_BATCH_POSITIONS:
        return 12
    return 14


def ctc_loss(
    activations: Float[Tensor, "t n a"], targets: Int[Tensor, "..."] | CTCTargets, input_lengths=None,
    target_lengths=None, *, zero_infinity: bool = False, out_loss: Float[Tensor, " n"] | None = None,
    out_grad: Float[Tensor, "t n a"] | None = None,
) -> tuple[Float[Tensor, " n"], Float[Tensor, "t n a"]]:
    """The chapter's CTC loss: step 12, 13 or 14, as :func:`final_step` picks for the shape and the longest target;
    loss ``(N,)`` and the gradient of its sum (arguments as :func:`step01_baseline`). To replay a graph over new
    targets: :class:`CTCPlan`."""
    shape = tuple(getattr(activations, "shape", ()))
    if len(shape) == 3 and not isinstance(targets, CTCTargets):  # packed here, once: the rule reads the longest
        T, N, A = shape
        targets = prepare_targets(targets, input_lengths, target_lengths, num_classes=A, max_time=T,
                                  device=activations.device, batch_size=N)
        input_lengths = target_lengths = None
    # a bad shape goes on to step 14, whose checks name it
    number = final_step(*shape, targets.max_positions) if len(shape) == 3 and min(shape) > 0 else 14
    step = {12: step12_flush_to_zero, 13: step13_two_passes, 14: step14_warps_per_direction}[number]
    return step(activations, targets, input_lengths, target_lengths, zero_infinity=zero_infinity, out_loss=out_loss,
                out_grad=out_grad)


cuda.declare_instances(SOURCES["ctc_block_recursion"], [n for step in (7, 8, 9, 10) for n in fused_kernel_names(step, 2)
                                                        if "<" in n])
cuda.declare_instances(SOURCES["ctc_branchless_recursion"], [recursion_name(10, o) for o in RECURSION_OPTIONS])
cuda.declare_instances(SOURCES["ctc_warps_recursion"], [f"ctc_warps_recursion<{v}>" for v in BLOCK_GRAINS])
