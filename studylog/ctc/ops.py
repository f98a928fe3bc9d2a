"""Chapter 4's entry point as a differentiable PyTorch operator, ``torch.ops.studylog.ctc_loss``: step 14's loss and
gradient, which its backward scales by each utterance's incoming gradient; on CPU tensors, the float64 reference."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor

from studylog.checks import check_tensor
from studylog.ctc.fused import launch
from studylog.ctc.reference import reference_ctc
from studylog.ctc.targets import MAX_TARGET_LENGTH, CTCTargets

#: The step the operator runs on the GPU: the chapter's final one, as :func:`~studylog.ctc.fused.ctc_loss`.
STEP = 14


def target_tensors(targets: CTCTargets) -> tuple[Tensor, ...]:
    """The operator's target arguments from the ``CTCTargets`` of :func:`~studylog.ctc.targets.prepare_targets`."""
    if not isinstance(targets, CTCTargets):
        raise TypeError(f"targets must be a CTCTargets (prepare_targets), got {type(targets).__name__}")
    return (targets.labels, targets.input_lengths, targets.target_lengths, targets.slot_class, targets.slot_start,
            targets.slot_members, targets.num_slots)


def _check(activations: Tensor, labels: Tensor, input_lengths: Tensor, target_lengths: Tensor, slot_class: Tensor,
           slot_start: Tensor, slot_members: Tensor, num_slots: Tensor) -> tuple[int, int, int]:
    """(T, N, A) after the metadata checks (the values were checked by prepare_targets)."""
    dtypes = (torch.float32,) if activations.device.type == "cuda" else (torch.float32, torch.float64)
    check_tensor("activations", activations, dtype=dtypes, ndim=3, contiguous=True)
    T, N, A = activations.shape
    if A < 2 or T < 1:
        raise ValueError(f"activations must be (T, N, A) with T >= 1 and A >= 2, got {tuple(activations.shape)}")
    lmax = labels.shape[1] if labels.ndim == 2 else 0
    umax = slot_class.shape[1] if slot_class.ndim == 2 else 0
    for name, t, shape in (("labels", labels, (N, None)), ("input_lengths", input_lengths, (N,)),
                           ("target_lengths", target_lengths, (N,)), ("slot_class", slot_class, (N, None)),
                           ("slot_start", slot_start, (N, umax + 1)), ("slot_members", slot_members, (N, lmax)),
                           ("num_slots", num_slots, (N,))):
        check_tensor(name, t, dtype=torch.int32, shape=shape, contiguous=True, like=activations)
    if lmax > MAX_TARGET_LENGTH:
        raise ValueError(f"labels have {lmax} columns, more than MAX_TARGET_LENGTH = {MAX_TARGET_LENGTH}")
    return T, N, A


def _ctc_loss(activations: Tensor, labels: Tensor, input_lengths: Tensor, target_lengths: Tensor, slot_class: Tensor,
              slot_start: Tensor, slot_members: Tensor, num_slots: Tensor,
              zero_infinity: bool = False) -> tuple[Tensor, Tensor]:
    """CTC loss ``(N,)`` of ``activations (T, N, A)`` and the gradient of its sum; differentiable through the loss."""
    _check(activations, labels, input_lengths, target_lengths, slot_class, slot_start, slot_members, num_slots)
    loss, grad = reference_ctc(activations, labels, input_lengths, target_lengths, zero_infinity=zero_infinity)
    return loss.to(activations.dtype), grad.to(activations.dtype)


ctc_loss = torch.library.custom_op("studylog::ctc_loss", _ctc_loss, mutates_args=())
ctc_loss.__doc__ = _ctc_loss.__doc__


@ctc_loss.register_kernel("cuda")
def _(activations, labels, input_lengths, target_lengths, slot_class, slot_start, slot_members, num_slots,
      zero_infinity=False):
    T, N, A = _check(activations, labels, input_lengths, target_lengths, slot_class, slot_start, slot_members,
                     num_slots)
    loss = torch.empty(N, dtype=torch.float32, device=activations.device)
    grad = torch.empty_like(activations)
    # what the launcher reads of a CTCTargets: the device arrays and their strides (no host copy of the lengths)
    packed = SimpleNamespace(labels=labels, input_lengths=input_lengths, target_lengths=target_lengths,
                             slot_class=slot_class, slot_start=slot_start, slot_members=slot_members,
                             num_slots=num_slots, label_stride=labels.shape[1], slot_stride=slot_class.shape[1],
                             max_positions=2 * labels.shape[1] + 1)
    launch(activations, packed, loss, grad, zero_infinity, STEP)
    return loss, grad


@ctc_loss.register_fake
def _(activations, labels, input_lengths, target_lengths, slot_class, slot_start, slot_members, num_slots,
      zero_infinity=False):
    T, N, A = _check(activations, labels, input_lengths, target_lengths, slot_class, slot_start, slot_members,
                     num_slots)
    return activations.new_empty((N,)), torch.empty_like(activations)


def _setup_context(ctx, inputs, output) -> None:
    _, grad = output
    ctx.save_for_backward(grad)
    ctx.mark_non_differentiable(grad)


def _backward(ctx, grad_loss: Tensor, _grad_of_grad: Tensor):
    (grad,) = ctx.saved_tensors
    return (grad * grad_loss[None, :, None],) + (None,) * 8


ctc_loss.register_autograd(_backward, setup_context=_setup_context)
