"""Step 6's arithmetic in torch ops (``ctc_step06_probability.cu``), on any device: what the lesson shows of float32
rescaling, and what the tests hold step 6's kernel and its underflow estimate to."""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Float64
from torch import Tensor

from studylog.ctc.reference import extended, shifted

#: The largest error of a float32 value stored below the normal range (FLT_MIN): two roundings to a multiple of 2^-149.
UNDERFLOW_ULP = 2.0 ** -148


def probability_space_ctc(
    activations: Float[Tensor, "t n a"], targets, input_lengths, target_lengths, *, dtype=torch.float32,
) -> tuple[Float[Tensor, " n"], Float[Tensor, "t n a"], Float64[Tensor, " n"]]:
    """Step 6's arithmetic in torch ops: loss, gradient and underflow estimate of each utterance, as
    ``ctc_step06_probability.cu`` computes them (``dtype`` float64: the same arithmetic with double's range). Each
    row is divided by the previous row's sum, its log added to a float64 offset. The estimate adds up, per frame and
    over its total, ``UNDERFLOW_ULP / y`` times the other direction's value for every reached entry below
    ``FLT_MIN`` (``inf`` where a frame's total is 0, an emission is below ``FLT_MIN`` or the loss is infinite)."""
    inputs, ext, sizes, skip_in, skip_out, pos, valid = extended(activations, targets, input_lengths, target_lengths)
    (T, N, _), S, dev, f32 = activations.shape, ext.shape[1], activations.device, dtype
    tiny = torch.finfo(dtype).tiny
    ulp = UNDERFLOW_ULP if dtype == torch.float32 else 2.0 * torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    probs = activations.detach().to(f32).softmax(2)
    y = probs.gather(2, ext[None].expand(T, N, S)) * valid[None]
    il = torch.as_tensor(inputs, device=dev)
    zero = torch.zeros((), dtype=f32, device=dev)
    inf = torch.full((N,), math.inf, dtype=torch.float64, device=dev)

    def sums(row: Tensor, skip: Tensor, by: int) -> Tensor:  # the recursion's sum of predecessors (by 1: alpha's)
        return row + shifted(row, by, 0.0) + shifted(row, 2 * by, 0.0) * skip

    alpha = torch.zeros((T, N, S), dtype=f32, device=dev)
    alpha_lost = torch.zeros((T, N, S), dtype=torch.bool, device=dev)  # reached, stored below FLT_MIN
    shift = torch.zeros(N, dtype=torch.float64, device=dev)
    log_likelihood = torch.full((N,), -math.inf, dtype=torch.float64, device=dev)
    for t in range(T):
        if t == 0:
            reached = (pos[None] <= 1) & valid
            v = torch.where(reached, y[0], zero)
        else:
            total = alpha[t - 1].sum(1)
            scale = torch.where(total > 0, 1.0 / total, torch.ones_like(total))
            shift += torch.where(total > 0, total.double().log(), torch.zeros_like(shift))
            pre = sums(alpha[t - 1], skip_in, 1)
            reached = (pre > 0) & valid
            v = pre * scale[:, None] * y[t]
        alpha[t] = v
        alpha_lost[t] = reached & (v < tiny)
        last = il - 1 == t
        if last.any():
            tail = v.gather(1, (sizes - 1)[:, None])[:, 0]
            tail = tail + torch.where(sizes > 1, v.gather(1, (sizes - 2).clamp(min=0)[:, None])[:, 0], zero)
            ll = torch.where(tail > 0, tail.double().log() + shift, -inf)
            log_likelihood = torch.where(last, ll, log_likelihood)
    loss = (-log_likelihood).to(f32)

    grad = probs.clone()
    estimate = torch.zeros(N, dtype=torch.float64, device=dev)
    beta = torch.zeros((N, S), dtype=f32, device=dev)
    ends = (pos[None] >= (sizes - 2)[:, None]) & valid
    for t in range(T - 1, -1, -1):
        active, start = t < il, t == il - 1
        total = beta.sum(1)
        scale = torch.where(total > 0, 1.0 / total, torch.ones_like(total))
        pre = torch.where(start[:, None], ends.to(f32), sums(beta, skip_out, -1) * scale[:, None])
        reached = torch.where(start[:, None], ends, sums(beta, skip_out, -1) > 0) & valid
        e = y[t]
        v = pre * e
        safe = torch.where(e > 0, e, torch.ones_like(e))
        a = alpha[t]
        p = torch.where(e > 0, a * v / safe, zero)
        frame_total = p.sum(1)
        lost = (torch.where(alpha_lost[t], v / safe, zero) + torch.where(reached & (v < tiny), a / safe, zero)
                + torch.where((a > 0) & (v > 0) & (a * v < tiny), 1.0 / safe, zero)).sum(1)
        frame = torch.where(frame_total > 0, lost.double() * ulp / frame_total.double(), inf)
        frame = torch.where((valid & (e < tiny)).any(1), inf, frame)
        estimate += torch.where(active, frame, torch.zeros_like(frame))
        post = p / frame_total[:, None]  # NaN where the frame's total is 0, as the kernel's gradient
        g = probs[t].scatter_add(1, ext, -post)
        grad[t] = torch.where(active[:, None], g, torch.zeros_like(g))
        beta = torch.where(active[:, None], v, beta)
    estimate = torch.where(torch.isinf(loss), inf, estimate)
    return loss, grad, estimate
