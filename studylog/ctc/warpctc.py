"""Steps 1 to 6 of chapter 4, warp-ctc's design: a softmax kernel, then a block per utterance for alpha and one for
beta and the gradient; steps 4 to 6 are templates on the grain (positions per thread) and its layout."""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from studylog import checks, cuda
from studylog.ctc.launch import kernels, prepare_call, run_step, workspace_addresses
from studylog.ctc.reference import UNDERFLOW_TOLERANCE, untrusted
from studylog.ctc.targets import CTCTargets

#: Grain sizes (positions per thread) compiled for steps 4 to 6.
GRAIN_SIZES = tuple(range(1, 9))
#: The ``.cu`` file (in ``studylog/ctc/csrc``) of each of steps 1 to 6, and of the softmax they launch first.
SOURCES = {1: "ctc_step01_baseline", 2: "ctc_step02_03_restrict_ldg", 3: "ctc_step02_03_restrict_ldg",
           4: "ctc_step04_05_blocked", 5: "ctc_step04_05_blocked", 6: "ctc_step06_probability"}
SOFTMAX_SOURCE = "ctc_softmax"

_SIG_SOFTMAX = ["ptr", "ptr", "i32", "i32"]
_SIG_ALPHA = ["ptr"] * 6 + ["i32"] * 4
_SIG_BETA = ["ptr"] * 12 + ["i32"] * 6
_SIG_BETA_STEP6 = ["ptr"] * 13 + ["i32"] * 6  # + the underflow estimate


class UnderflowWarning(RuntimeWarning):
    """Step 6 (probability space) returned answers that underflow may have made wrong."""


def kernel_names(step: int, grain: int | None = None, blocked: bool = False) -> tuple[str, str]:
    """(alpha kernel, beta + gradient kernel) of steps 1 to 6, as NVRTC name expressions."""
    if step == 1:
        return "ctc_alpha_step1", "ctc_beta_grad_step1"
    if step in (2, 3):  # one template each: LDG = false is step 2, true step 3
        ldg = "true" if step == 3 else "false"
        return f"ctc_alpha_restrict<{ldg}>", f"ctc_beta_grad_restrict<{ldg}>"
    if step in (4, 5, 6):
        checks.check_choice("grain", grain, GRAIN_SIZES)
        layout = "true" if blocked else "false"
        beta = 6 if step == 6 else 4  # step 5 only changes the alpha kernel
        return f"ctc_alpha_step{step}<{grain}, {layout}>", f"ctc_beta_grad_step{beta}<{grain}, {layout}>"
    raise ValueError(f"steps 1 to 6 have alpha/beta kernels; got step {step!r}")


def _signatures(step: int, names: Sequence[str]) -> list[tuple[str, list[str]]]:
    return [(n, _SIG_ALPHA if "alpha" in n else (_SIG_BETA_STEP6 if step == 6 else _SIG_BETA)) for n in names]


def instance_names(step: int, grains: Sequence[int], layouts: Sequence[bool] = (False,)) -> list[str]:
    """The kernels of step 4, 5 or 6 at the grain sizes ``grains`` in the ``layouts``, each once."""
    return list(dict.fromkeys(n for vt in grains for blocked in layouts for n in kernel_names(step, vt, blocked)))


def preload_blocked(step: int, grains: Sequence[int], layouts: Sequence[bool] = (False,)) -> None:
    """Compile :func:`instance_names` in one NVRTC call."""
    kernels(SOURCES[step], _signatures(step, instance_names(step, grains, layouts)))


def default_grain(max_positions: int) -> int:
    """warp-ctc's rule of thumb: about 128 threads per utterance, as many positions per thread as needed."""
    return min(max(1, math.ceil(max_positions / 128)), GRAIN_SIZES[-1])


def block_threads(max_positions: int, grain: int) -> int:
    """Threads per utterance for grain size ``grain``: every position covered, in whole warps."""
    return 32 * math.ceil(math.ceil(max_positions / grain) / 32)


def launch(x: Tensor, batch: CTCTargets, loss: Tensor, grad: Tensor, step: int, zero_infinity: bool,
           grain: int | None = None, blocked: bool = False, estimate: Tensor | None = None) -> None:
    """Launch step ``step`` (1 to 6) on checked inputs (nothing here is checked again)."""
    T, N, A = x.shape
    smax, lmax, umax = batch.max_positions, batch.label_stride, batch.slot_stride
    scratch = [T * N * A * 4, N * T * smax * 4, N * 8]  # float32 bytes, but the float64 log-likelihoods
    buffer, (probs, alphas, log_likelihood) = workspace_addresses(x.device, scratch)
    (softmax,) = kernels(SOFTMAX_SOURCE, [("ctc_softmax_rows" if step == 6 else "ctc_log_softmax_rows", _SIG_SOFTMAX)])
    softmax(((T * N + 7) // 8,), (256,), x, probs, T * N, A)
    if step <= 3:
        threads, alpha_smem = 128, 0
    else:
        grain = default_grain(smax) if grain is None else grain
        threads = block_threads(smax, grain)
        if threads > 1024:
            raise ValueError(f"grain {grain} needs {threads} threads for {smax} positions; use a larger grain")
        alpha_smem = 0 if step == 4 else 2 * smax * 4
    alpha, beta = kernels(SOURCES[step], _signatures(step, kernel_names(step, grain, blocked)))
    alpha((N,), (threads,), probs, batch.labels, batch.input_lengths, batch.target_lengths, alphas, log_likelihood,
          T, N, A, lmax, shared_mem=alpha_smem)
    outputs = (grad, loss) if estimate is None else (grad, loss, estimate)
    beta((N,), (threads,), probs, batch.labels, batch.input_lengths, batch.target_lengths, batch.slot_class,
         batch.slot_start, batch.slot_members, batch.num_slots, alphas, log_likelihood, *outputs,
         T, N, A, lmax, umax, int(zero_infinity), shared_mem=3 * smax * 4)
    del buffer  # queued: the memory may be reused by the next allocation on this stream


def check_grain(grain: int | None) -> int | None:
    return grain if grain is None else checks.check_choice("grain", grain, GRAIN_SIZES)


def untrusted_answers(loss: Tensor, estimate: Tensor, batch: CTCTargets) -> Tensor:
    """:func:`untrusted` of a step 6 answer, from its loss and underflow estimate; waits for the GPU."""
    # with zero_infinity an underflowed (infinite) loss reads 0: the estimate stays inf, so judge by it
    judged = torch.where(torch.isinf(estimate), torch.full_like(loss, math.inf), loss)
    return untrusted(estimate, judged, batch.input_lengths_host, batch.label_lists)


def step01_baseline(
    activations: Float[Tensor, "t n a"], targets: Int[Tensor, "..."] | CTCTargets, input_lengths=None,
    target_lengths=None, *, zero_infinity: bool = False, out_loss: Float[Tensor, " n"] | None = None,
    out_grad: Float[Tensor, "t n a"] | None = None,
) -> tuple[Float[Tensor, " n"], Float[Tensor, "t n a"]]:
    """Step 1, warp-ctc's baseline: CTC loss per utterance and the gradient of its sum w.r.t. the activations.

    ``targets``: a :class:`CTCTargets` (then no lengths), or raw targets and lengths; ``out_loss`` / ``out_grad``:
    the caller's buffers. Every step takes these arguments; with prepared targets a call can be captured in a CUDA
    graph after one eager call (which compiles the kernels).
    """
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad, 1, zero_infinity)


def step02_restrict(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                    out_loss=None, out_grad=None):
    """Step 2: step 1's kernels with every pointer ``__restrict__``."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad, 2, zero_infinity)


def step03_ldg(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
               out_loss=None, out_grad=None):
    """Step 3: step 2 with read-only loads through ``__ldg``."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad, 3, zero_infinity)


def step04_register_blocking(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                             grain: int | None = None, blocked: bool = False, out_loss=None, out_grad=None):
    """Step 4: each thread keeps ``grain`` positions (labels, skip flags) in registers (one of ``GRAIN_SIZES``;
    :func:`default_grain` when None); ``blocked`` lays a thread's positions out consecutively."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad,
                    4, zero_infinity, check_grain(grain), blocked)


def step05_shared_rows(activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                       grain: int | None = None, blocked: bool = False, out_loss=None, out_grad=None):
    """Step 5: step 4 with the alpha kernel's two live rows in shared memory."""
    return run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad,
                    5, zero_infinity, check_grain(grain), blocked)


def step06_probability_space(activations, targets, input_lengths=None, target_lengths=None, *,
                             zero_infinity=False, grain: int | None = None, blocked: bool = False, out_loss=None,
                             out_grad=None, out_estimate: Float[Tensor, " n"] | None = None, warn: bool = True):
    """Step 6: step 5 in probability space, rescaled every frame (Graves): the lesson's counterexample.

    Rescaling keeps a row's sum in range, not the spread within it, so an answer may be silently wrong. The kernels
    estimate each utterance's underflow error (into ``out_estimate``); with ``warn`` the call waits for the GPU and
    warns (:class:`UnderflowWarning`) of the answers it cannot trust, else judge them with :func:`untrusted_answers`.
    """
    grain = check_grain(grain)
    if out_estimate is not None:  # before the call's own checks, which need a GPU
        checks.check_tensor("out_estimate", out_estimate, dtype=torch.float32, ndim=1, contiguous=True)
    batch, loss, grad = prepare_call(activations, targets, input_lengths, target_lengths, out_loss, out_grad)
    N = activations.shape[1]
    estimate = (torch.empty((N,), dtype=torch.float32, device=activations.device) if out_estimate is None
                else checks.check_tensor("out_estimate", out_estimate, shape=(N,), like=activations))
    launch(activations, batch, loss, grad, 6, zero_infinity, grain, blocked, estimate)
    if warn:
        bad = untrusted_answers(loss, estimate, batch)
        if bad.any():
            names = [int(i) for i in torch.nonzero(bad).flatten()]
            warnings.warn(UnderflowWarning(
                f"probability space (step 6) underflowed: the answer for utterance(s) {names} cannot be trusted "
                f"(underflow estimate above {UNDERFLOW_TOLERANCE:g}, or an infinite loss for a target that fits "
                f"its input); use a log-space step (ctc_loss)"), stacklevel=2)
    return loss, grad


cuda.declare_instances(SOURCES[2], [n for step in (2, 3) for n in kernel_names(step)])
cuda.declare_instances(SOURCES[6], [n for b in (False, True) for n in kernel_names(6, 2, b)])
