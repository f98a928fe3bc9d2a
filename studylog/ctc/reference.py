"""Chapter 4's yardsticks, on any device: the float64 reference and how far a result is from it."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from jaxtyping import Float, Float64, Int
from torch import Tensor

from studylog.ctc.targets import label_lists, min_frames, validate_lengths

#: Targets (and the tolerance of the checks) for the log-space steps: the largest relative loss error
#: (over ``max(1, |loss|)``) and the norm-relative gradient error against float64.
LOSS_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-4
#: Step 6's answer for an utterance cannot be trusted when its underflow estimate (relative error of P) exceeds this.
UNDERFLOW_TOLERANCE = min(LOSS_TOLERANCE, GRAD_TOLERANCE)


def shifted(row: Tensor, by: int, fill: float = -math.inf) -> Tensor:
    """``row[:, s - by]`` (``by`` > 0) or ``row[:, s + |by|]``, ``fill`` outside the row."""
    padded = torch.nn.functional.pad(row, (max(by, 0), max(-by, 0)), value=fill)
    return padded[:, :row.shape[1]] if by > 0 else padded[:, -by:]


def extended(activations: Tensor, targets, input_lengths, target_lengths):
    """What a model of the recursion starts from: the input lengths (numpy), the blank-interleaved labels ``(N, S)``,
    S per utterance, the alpha/beta skip masks, the positions ``(S,)`` and which of them each utterance has."""
    if not isinstance(activations, Tensor) or activations.ndim != 3:
        raise ValueError("activations must be a (T, N, A) tensor")
    T, N, A = activations.shape
    inputs, lengths = validate_lengths(input_lengths, target_lengths, batch=N, max_time=T)
    lists = label_lists(targets, lengths, A)
    smax = 2 * max([len(l) for l in lists] + [0]) + 1
    ext = np.zeros((N, smax), np.int64)
    skip_in = np.zeros((N, smax), bool)  # alpha: s may be reached from s - 2
    for i, labels in enumerate(lists):
        ext[i, 1:2 * len(labels):2] = labels
        if len(labels) > 1:
            skip_in[i, 3:2 * len(labels):2] = labels[1:] != labels[:-1]
    skip_out = np.zeros_like(skip_in)  # beta: s may go on to s + 2
    skip_out[:, :-2] = skip_in[:, 2:]
    dev = activations.device
    sizes = torch.tensor([2 * len(l) + 1 for l in lists], device=dev)
    pos = torch.arange(smax, device=dev)
    return (inputs, torch.from_numpy(ext).to(dev), sizes, torch.from_numpy(skip_in).to(dev),
            torch.from_numpy(skip_out).to(dev), pos, pos[None, :] < sizes[:, None])


def reference_ctc(activations: Float[Tensor, "t n a"], targets: Int[Tensor, "..."], input_lengths, target_lengths, *,
                  zero_infinity: bool = False) -> tuple[Float64[Tensor, " n"], Float64[Tensor, "t n a"]]:
    """Loss per utterance and d(sum of losses)/d(activations) in float64, by plain log-space recursions. An
    infeasible target gives an infinite loss and a NaN gradient over its frames (as torch does), or 0 and 0 with
    ``zero_infinity``; frames past an utterance's input length get a zero gradient."""
    inputs, ext, sizes, skip_in, skip_out, pos, valid = extended(activations, targets, input_lengths, target_lengths)
    (T, N, _), S, dev = activations.shape, ext.shape[1], activations.device
    log_probs = activations.detach().to(torch.float64).log_softmax(2)
    neg = torch.tensor(-math.inf, dtype=torch.float64, device=dev)
    em = log_probs.gather(2, ext[None].expand(T, N, S))  # (T, N, S) log-probability of each position
    em = torch.where(valid[None], em, neg)

    alpha = torch.full((T, N, S), -math.inf, dtype=torch.float64, device=dev)
    alpha[0] = torch.where(pos[None] <= 1, em[0], neg)
    for t in range(1, T):
        prev = alpha[t - 1]
        terms = torch.stack([prev, shifted(prev, 1), torch.where(skip_in, shifted(prev, 2), neg)])
        alpha[t] = torch.logsumexp(terms, 0) + em[t]

    t_last = torch.as_tensor(inputs - 1, device=dev)
    last = alpha[t_last, torch.arange(N, device=dev)]  # (N, S)
    end = last.gather(1, (sizes - 1)[:, None])[:, 0]
    before_end = torch.where(sizes > 1, last.gather(1, (sizes - 2).clamp(min=0)[:, None])[:, 0], neg)
    log_likelihood = torch.logaddexp(end, before_end)

    beta = torch.full((T + 1, N, S), -math.inf, dtype=torch.float64, device=dev)
    init = (pos[None] == (sizes - 1)[:, None]) | ((pos[None] == (sizes - 2)[:, None]) & (sizes[:, None] > 1))
    for t in range(T - 1, -1, -1):
        nxt = beta[t + 1]
        terms = torch.stack([nxt, shifted(nxt, -1), torch.where(skip_out, shifted(nxt, -2), neg)])
        recursed = torch.logsumexp(terms, 0) + em[t]
        started = torch.where(init, em[t], neg)
        frame = torch.as_tensor(t, device=dev)
        beta[t] = torch.where((frame == t_last)[:, None], started,
                              torch.where((frame < t_last)[:, None], recursed, neg))
    beta = beta[:T]

    in_range = torch.arange(T, device=dev)[:, None] < t_last[None, :] + 1  # (T, N)
    log_post = alpha + beta - torch.where(valid[None], em, torch.zeros((), dtype=torch.float64, device=dev))
    post = torch.exp(log_post - log_likelihood[None, :, None])
    post = torch.where(in_range[:, :, None], post, torch.zeros((), dtype=torch.float64, device=dev))
    grad = log_probs.exp().scatter_add(2, ext[None].expand(T, N, S), -post)
    grad = torch.where(in_range[:, :, None], grad, torch.zeros((), dtype=torch.float64, device=dev))

    loss = -log_likelihood
    infinite = torch.isinf(loss)
    if zero_infinity:
        loss = torch.where(infinite, torch.zeros_like(loss), loss)
        grad = torch.where(infinite[None, :, None], torch.zeros_like(grad), grad)
    else:
        nan = torch.tensor(math.nan, dtype=torch.float64, device=dev)
        grad = torch.where(infinite[None, :, None] & in_range[:, :, None], nan, grad)
    return loss, grad


def untrusted(estimate: Tensor, loss: Tensor, input_lengths, target_lists: Sequence) -> Tensor:
    """A bool per utterance: an underflow estimate above ``UNDERFLOW_TOLERANCE``, or an infinite loss for a
    target that fits its input (right only where no alignment exists)."""
    estimate, loss = estimate.detach().double().cpu(), loss.detach().double().cpu()
    feasible = torch.tensor([min_frames(labels) <= int(n) for labels, n in zip(target_lists, input_lengths)],
                            dtype=torch.bool)
    infinite = ~torch.isfinite(loss)
    return torch.where(infinite, feasible, estimate > UNDERFLOW_TOLERANCE)


def errors(loss: Tensor, grad: Tensor, ref_loss: Tensor, ref_grad: Tensor) -> dict[str, float]:
    """How far a result is from the reference: ``mismatched`` utterances (finite in one only, or a finite loss with a
    NaN gradient), the largest ``loss_rel`` (over ``max(1, |ref|)``) and ``grad_rel`` (``||grad - ref|| / ||ref||``)
    over utterances finite in both, and ``silently_wrong``: wrong (:func:`wrong_utterances`) with a finite loss and
    a gradient without NaN to show it."""
    u = _per_utterance(loss, grad, ref_loss, ref_grad)
    both = u["finite"] & u["ref_finite"]
    loss_rel, grad_rel = 0.0, 0.0
    if both.any():
        grad, cols = grad.detach().double(), both.to(grad.device)
        g, r = grad[:, cols], ref_grad.detach().to(grad.device, torch.float64)[:, cols]
        loss_rel = float(u["loss_off"][both].max())
        grad_rel = float(torch.linalg.vector_norm(g - r)) / max(float(torch.linalg.vector_norm(r)), 1e-300)
    return {"loss_rel": loss_rel, "grad_rel": grad_rel,
            "mismatched": int((u["finite"] != u["ref_finite"]).sum() + (both & u["nan"]).sum()),
            "silently_wrong": int(u["silent"].sum())}


def _per_utterance(loss: Tensor, grad: Tensor, ref_loss: Tensor, ref_grad: Tensor) -> dict[str, Tensor]:
    """Per utterance, on the CPU: whether the loss is ``finite`` and the reference's, a ``nan`` in the gradient, the
    loss's error over ``max(1, |ref|)`` (``loss_off``), the gradient's norm-relative one (``grad_off``; a NaN in it
    counts as infinite), and whether the answer is ``wrong`` (:func:`wrong_utterances`) and ``silent``ly so."""
    loss, ref_loss = loss.detach().double().cpu(), ref_loss.detach().double().cpu()
    grad = grad.detach().double()
    ref_grad = ref_grad.detach().to(grad.device, torch.float64)
    diff = torch.linalg.vector_norm((grad - ref_grad).nan_to_num(math.inf), dim=(0, 2))
    norm = torch.linalg.vector_norm(ref_grad.nan_to_num(0.0), dim=(0, 2))
    u = {"finite": torch.isfinite(loss), "ref_finite": torch.isfinite(ref_loss),
         "nan": torch.isnan(grad).any(2).any(0).cpu(), "grad_off": (diff / norm.clamp(min=1e-300)).cpu(),
         "loss_off": (loss - ref_loss).abs() / ref_loss.abs().clamp(min=1.0)}
    u["wrong"] = (u["finite"] != u["ref_finite"]) | (u["finite"] & u["ref_finite"] & (
        u["nan"] | (u["loss_off"] > LOSS_TOLERANCE) | (u["grad_off"] > GRAD_TOLERANCE)))
    u["silent"] = u["wrong"] & u["finite"] & ~u["nan"]
    return u


def wrong_utterances(loss: Tensor, grad: Tensor, ref_loss: Tensor, ref_grad: Tensor) -> Tensor:
    """A bool per utterance: finite where the reference is not (or the reverse), a NaN in the gradient of a
    finite loss, or a loss or gradient outside ``LOSS_TOLERANCE`` / ``GRAD_TOLERANCE`` (as in :func:`errors`)."""
    return _per_utterance(loss, grad, ref_loss, ref_grad)["wrong"]


#: An answer *far* from float64 (loss and gradient errors as in :func:`errors`): what losing alignments to
#: underflow does, well beyond float32 rounding.
FAR_LOSS, FAR_GRAD = 1e-3, 1e-2


def outcomes(loss: Tensor, grad: Tensor, ref_loss: Tensor, ref_grad: Tensor) -> dict[str, int]:
    """What happened to each utterance, counted: ``utterances``, ``impossible`` (the reference's loss is
    infinite), and of the others ``infinite``, ``nan`` (a NaN loss or gradient), ``finite_wrong``
    (``silently_wrong`` of :func:`errors`), ``far`` (of those, beyond ``FAR_LOSS`` / ``FAR_GRAD``) and ``right``."""
    u = _per_utterance(loss, grad, ref_loss, ref_grad)
    possible, loss_c = u["ref_finite"], loss.detach().double().cpu()
    silent = possible & u["silent"]
    far = silent & ((u["loss_off"] > FAR_LOSS) | (u["grad_off"] > FAR_GRAD))
    return {"utterances": int(loss_c.numel()), "impossible": int((~possible).sum()),
            "infinite": int((possible & torch.isinf(loss_c)).sum()),
            "nan": int((possible & (torch.isnan(loss_c) | (u["finite"] & u["nan"]))).sum()),
            "finite_wrong": int(silent.sum()), "far": int(far.sum()), "right": int((possible & ~u["wrong"]).sum())}
