"""Chapter 4: CTC loss and its gradient with respect to the activations, in CUDA C++.

The operation is the one warp-ctc and cuDNN provide: activations (pre-softmax logits) of shape
``(T, N, A)``, one target label sequence per utterance, input and target lengths, blank = 0.
The output is the per-utterance negative log-likelihood ``loss[N]`` and the gradient of
``loss.sum()`` with respect to the activations, ``grad[T, N, A]`` (softmax included).

Ten steps, each a kernel (or a small set of kernels) next to the previous one:

1. ``baseline``: warp-ctc style. A log-softmax kernel writes log-probabilities; one block per
   utterance runs the alpha recursion with the whole alpha matrix in global memory; a second
   kernel runs the beta recursion and writes the gradient frame by frame.
2. ``restrict``: the same kernels with ``__restrict__`` pointers.
3. ``ldg``: read-only loads through ``__ldg``.
4. ``register blocking``: each thread keeps ``VT`` positions (labels, skip flags) in registers;
   the grain size ``VT`` is a template parameter and is swept.
5. ``shared alpha rows``: the alpha kernel reads the previous row from shared memory (two live
   rows) and only writes the matrix out for the gradient.
6. ``probability space``: step 5 with probabilities rescaled at every frame (Graves) instead of
   log-probabilities.
7. ``fused softmax``: the softmax is never written out. One pass computes each frame's
   log-sum-exp and gathers the emissions of the target's labels; one warp per utterance and
   direction runs alpha and beta at the same time from those emissions, rows in registers;
   a last pass writes ``softmax - posterior`` straight from the activations.
8. ``branch-free recursion``: step 7's warp recursion without the divergent branch it took at
   every label position (three-term log-sum-exp everywhere, the skip term masked to -inf), with
   flush-to-zero ``ex2``/``lg2`` and the row maximum as one ``redux.sync`` (template options).
9. ``two passes``: the first pass also writes the softmax as the gradient (it holds the frame in
   registers), and the last pass only corrects the target's classes in place: the activations
   cross DRAM once.
10. ``several warps per direction``: the recursion spread over a block of W warps (2 or 4
    positions per thread), boundary values and row maxima exchanged through shared memory with
    one barrier per frame.

Every log-space step renormalises its rows by their maximum at every frame (the loss adds the
maxima up in float64) and divides each frame's posterior by its own sum: plain float32 log space
accumulates ``|log alpha| ~ T log A`` and loses about 1e-4 of relative accuracy in the gradient
at T = 150, which is the whole error budget.

Host-side preparation (validation, padding, the list of distinct classes of each target) is done
once per batch by :func:`prepare_targets`; the kernels then only read small int32 arrays.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from jaxtyping import Float, Float64, Int
from torch import Tensor

from studylog import cuda, runtime  # noqa: F401  (runtime: GPU or interpreter is chosen first)

BLANK = 0
#: Longest target the kernels accept (2 L + 1 <= 1023 positions: one warp holds 32 x 32 of them).
MAX_TARGET_LENGTH = 511

STEPS: dict[int, str] = {
    1: "baseline",
    2: "restrict",
    3: "ldg",
    4: "register blocking",
    5: "shared alpha rows",
    6: "probability space",
    7: "fused softmax",
    8: "branch-free recursion",
    9: "two passes",
    10: "several warps per direction",
}
#: The last step: what the chapter's headline and targets are measured on.
FINAL_STEP = max(STEPS)
#: Grain sizes (positions per thread) compiled for steps 4 to 6.
GRAIN_SIZES = tuple(range(1, 9))
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
#: The options steps 8 and 9 use unless told otherwise (the fastest in the first H200 run, where the
#: redux.sync maximum was about 3 % slower than the shuffles at 10 positions per lane).
DEFAULT_RECURSION = "+ ftz ex2/lg2"
#: The step whose recursion options the benchmark compares.
OPTIONS_STEP = 9
#: Positions per thread compiled for step 10's block recursion, and the one it uses by default.
BLOCK_GRAINS = (2, 4)
DEFAULT_BLOCK_GRAIN = 4
#: Most warps one direction of step 10 may use (the kernel's shared exchange has this many slots).
MAX_RECURSION_WARPS = 16

WARPCTC_SOURCE = "ctc_warpctc.cu"
BLOCKED_SOURCE = "ctc_blocked.cu"
FUSED_SOURCE = "ctc_fused.cu"


# --------------------------------------------------------------------------------------
# Validation and preparation of the targets (host side, once per batch)
# --------------------------------------------------------------------------------------

def _lengths(value, name: str, batch: int) -> np.ndarray:
    """A length vector as int64 numpy, from a 1-D integer tensor (any device) or a sequence."""
    if isinstance(value, Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
        if value.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
        array = value.detach().to("cpu", torch.int64).numpy()
    elif isinstance(value, (list, tuple, np.ndarray)):
        array = np.asarray(value)
        if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
            raise TypeError(f"{name} must be a 1-D sequence of integers")
        array = array.astype(np.int64)
    else:
        raise TypeError(f"{name} must be a 1-D integer tensor or a sequence of ints, got {type(value).__name__}")
    if array.shape[0] != batch:
        raise ValueError(f"{name} has {array.shape[0]} entries but the batch has N = {batch}")
    return array


def _label_lists(targets: Tensor, target_lengths: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """Per-utterance label arrays from concatenated (1-D) or padded (2-D) targets, validated."""
    if not isinstance(targets, Tensor):
        raise TypeError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"targets must be int32 or int64, got {targets.dtype}")
    batch = target_lengths.shape[0]
    host = targets.detach().to("cpu", torch.int64).numpy()
    if targets.ndim == 1:
        if host.shape[0] != int(target_lengths.sum()):
            raise ValueError(f"concatenated targets hold {host.shape[0]} labels but target_lengths sum to "
                             f"{int(target_lengths.sum())}")
        ends = np.cumsum(target_lengths)
        lists = [host[e - l:e] for e, l in zip(ends, target_lengths)]
    elif targets.ndim == 2:
        if host.shape[0] != batch:
            raise ValueError(f"padded targets must have N = {batch} rows, got shape {tuple(targets.shape)}")
        if batch and int(target_lengths.max()) > host.shape[1]:
            raise ValueError(f"target_lengths go up to {int(target_lengths.max())} but padded targets have "
                             f"only {host.shape[1]} columns")
        lists = [host[i, :l] for i, l in enumerate(target_lengths)]
    else:
        raise ValueError(f"targets must be 1-D (concatenated) or 2-D (N, S) padded, got shape {tuple(targets.shape)}")
    for i, labels in enumerate(lists):
        if labels.size and (labels == BLANK).any():
            raise ValueError(f"targets of utterance {i} contain the blank label {BLANK}; labels must be in [1, A)")
        if labels.size and ((labels < 0).any() or (labels >= num_classes).any()):
            raise ValueError(f"targets of utterance {i} hold labels outside [1, {num_classes}) (A = {num_classes})")
    return [np.ascontiguousarray(labels) for labels in lists]


def validate_lengths(input_lengths, target_lengths, *, batch: int, max_time: int) -> tuple[np.ndarray, np.ndarray]:
    """Input lengths in [1, T] and target lengths in [0, MAX_TARGET_LENGTH], as int64 numpy."""
    inputs = _lengths(input_lengths, "input_lengths", batch)
    targets = _lengths(target_lengths, "target_lengths", batch)
    if inputs.size and (inputs.min() < 1 or inputs.max() > max_time):
        raise ValueError(f"input_lengths must be in [1, T = {max_time}], got values in "
                         f"[{int(inputs.min())}, {int(inputs.max())}]")
    if targets.size and (targets.min() < 0 or targets.max() > MAX_TARGET_LENGTH):
        raise ValueError(f"target_lengths must be in [0, {MAX_TARGET_LENGTH}], got values in "
                         f"[{int(targets.min())}, {int(targets.max())}]")
    return inputs, targets


@dataclass(frozen=True)
class CTCTargets:
    """Targets validated and packed for the kernels: build once per batch with :func:`prepare_targets`.

    ``slot`` arrays list, for each utterance, the distinct classes of ``blank + target``: slot 0 is
    the blank, slot ``u >= 1`` a label, with the target positions ``j`` (1-based) where it occurs
    in ``slot_members[slot_start[u]:slot_start[u + 1]]``. The gradient kernels use them to add up
    the posterior of a class that occurs several times without atomics.
    """

    num_classes: int
    max_time: int
    input_lengths_host: tuple[int, ...]
    target_lengths_host: tuple[int, ...]
    label_lists: tuple[np.ndarray, ...]
    label_stride: int  # columns of ``labels`` (>= 1): the kernels' L_max
    slot_stride: int  # columns of ``slot_class`` (>= 1): the kernels' U_max
    labels: Int[Tensor, "n lmax"]
    input_lengths: Int[Tensor, " n"]
    target_lengths: Int[Tensor, " n"]
    slot_class: Int[Tensor, "n umax"]
    slot_start: Int[Tensor, "n umax_plus_1"]
    slot_members: Int[Tensor, "n lmax"]
    num_slots: Int[Tensor, " n"]

    @property
    def batch(self) -> int:
        return len(self.input_lengths_host)

    @property
    def max_positions(self) -> int:
        """``2 L_max + 1`` with the padded ``L_max``: rows of alpha and beta have this many entries."""
        return 2 * self.label_stride + 1

    @property
    def device(self) -> torch.device:
        return self.labels.device


def prepare_targets(
    targets: Int[Tensor, "..."],
    input_lengths,
    target_lengths,
    *,
    num_classes: int,
    max_time: int,
    device: torch.device | str | None = None,
    batch_size: int | None = None,
) -> CTCTargets:
    """Validate targets and lengths and pack them (one host-to-device copy) for the kernels.

    ``targets`` is concatenated (1-D, ``sum(target_lengths)`` labels) or padded ``(N, S)``, int32
    or int64, on any device. ``input_lengths`` must be in ``[1, max_time]``; labels in ``[1, A)``.
    Targets too long for their input are allowed: their loss is infinite (see ``zero_infinity``).
    ``batch_size`` (N) is taken from the lengths when not given.
    """
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes (A) must be an int >= 2, got {num_classes!r}")
    if not isinstance(max_time, int) or max_time < 1:
        raise ValueError(f"max_time (T) must be an int >= 1, got {max_time!r}")
    batch = batch_size
    for value in (input_lengths, target_lengths) if batch is None else ():
        if isinstance(value, (Tensor, np.ndarray)) and value.ndim == 1:
            batch = value.shape[0]
            break
        if isinstance(value, (list, tuple)):
            batch = len(value)
            break
    if batch is None:
        raise TypeError("input_lengths and target_lengths must be 1-D integer tensors or sequences of ints")
    inputs, lengths = validate_lengths(input_lengths, target_lengths, batch=batch, max_time=max_time)
    lists = _label_lists(targets, lengths, num_classes)
    device = torch.device(device) if device is not None else runtime.device()

    label_stride = max(1, int(lengths.max()) if batch else 1)
    slots = []
    for labels in lists:
        classes, first = np.unique(labels, return_index=True)
        order = np.argsort(first, kind="stable")  # slots in order of first occurrence
        classes = classes[order]
        members = [np.flatnonzero(labels == c) + 1 for c in classes]  # 1-based target positions
        slots.append((classes, members))
    slot_stride = max(1, max(len(c) + 1 for c, _ in slots) if batch else 1)

    labels_pad = np.zeros((batch, label_stride), np.int32)
    slot_class = np.zeros((batch, slot_stride), np.int32)  # slot 0 = blank = class 0
    slot_members = np.zeros((batch, label_stride), np.int32)
    num_slots = np.zeros(batch, np.int32)
    for i, (labels, (classes, members)) in enumerate(zip(lists, slots)):
        labels_pad[i, :labels.size] = labels
        slot_class[i, 1:len(classes) + 1] = classes
        if members:
            slot_members[i, :labels.size] = np.concatenate(members)
        num_slots[i] = len(classes) + 1
    # slot u's members are slot_members[slot_start[u]:slot_start[u + 1]]; the blank (u = 0) lists none
    slot_start = np.zeros((batch, slot_stride + 1), np.int32)
    for i, (classes, members) in enumerate(slots):
        offsets = np.cumsum([0] + [m.size for m in members])
        slot_start[i, 1:len(offsets) + 1] = offsets
        slot_start[i, len(offsets) + 1:] = offsets[-1]

    parts = [labels_pad.ravel(), inputs.astype(np.int32), lengths.astype(np.int32), slot_class.ravel(),
             slot_start.ravel(), slot_members.ravel(), num_slots]
    packed = torch.from_numpy(np.concatenate(parts)).to(device)
    views, offset = [], 0
    for part, shape in zip(parts, [labels_pad.shape, (batch,), (batch,), slot_class.shape, slot_start.shape,
                                   slot_members.shape, (batch,)]):
        views.append(packed[offset:offset + part.size].view(shape))
        offset += part.size
    return CTCTargets(
        num_classes=num_classes, max_time=max_time,
        input_lengths_host=tuple(int(v) for v in inputs), target_lengths_host=tuple(int(v) for v in lengths),
        label_lists=tuple(lists), label_stride=label_stride, slot_stride=slot_stride,
        labels=views[0], input_lengths=views[1], target_lengths=views[2], slot_class=views[3],
        slot_start=views[4], slot_members=views[5], num_slots=views[6],
    )


def min_frames(labels: Sequence[int] | np.ndarray) -> int:
    """Fewest frames that can emit ``labels``: one per label plus a blank between repeats."""
    labels = np.asarray(labels)
    return int(labels.size + (labels[1:] == labels[:-1]).sum()) if labels.size else 0


# --------------------------------------------------------------------------------------
# The float64 reference (torch ops, any device; vectorised over the batch, a loop over T)
# --------------------------------------------------------------------------------------

def _extended(lists: Sequence[np.ndarray], device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Blank-interleaved labels ``(N, S)``, S per utterance, and the alpha/beta skip masks."""
    batch = len(lists)
    smax = 2 * max([len(l) for l in lists] + [0]) + 1
    ext = np.zeros((batch, smax), np.int64)
    skip_in = np.zeros((batch, smax), bool)  # alpha: s may be reached from s - 2
    for i, labels in enumerate(lists):
        ext[i, 1:2 * len(labels):2] = labels
        if len(labels) > 1:
            skip_in[i, 3:2 * len(labels):2] = labels[1:] != labels[:-1]
    skip_out = np.zeros_like(skip_in)  # beta: s may go on to s + 2
    skip_out[:, :-2] = skip_in[:, 2:]
    sizes = torch.tensor([2 * len(l) + 1 for l in lists], device=device)
    return (torch.from_numpy(ext).to(device), sizes, torch.from_numpy(skip_in).to(device),
            torch.from_numpy(skip_out).to(device))


def reference_ctc(
    activations: Float[Tensor, "t n a"],
    targets: Int[Tensor, "..."],
    input_lengths,
    target_lengths,
    *,
    zero_infinity: bool = False,
) -> tuple[Float64[Tensor, " n"], Float64[Tensor, "t n a"]]:
    """Loss per utterance and d(sum of losses)/d(activations), in float64 (the yardstick).

    Plain log-space alpha/beta recursions over the blank-interleaved target; the gradient is
    ``softmax - posterior``. An infeasible target gives an infinite loss and a NaN gradient over
    its frames (as torch does), or 0 and 0 with ``zero_infinity``. Frames past an utterance's
    input length get a zero gradient.
    """
    if not isinstance(activations, Tensor) or activations.ndim != 3:
        raise ValueError("activations must be a (T, N, A) tensor")
    T, N, A = activations.shape
    inputs, lengths = validate_lengths(input_lengths, target_lengths, batch=N, max_time=T)
    lists = _label_lists(targets, lengths, A)
    dev = activations.device
    x = activations.detach().to(torch.float64)
    log_probs = x.log_softmax(2)
    ext, sizes, skip_in, skip_out = _extended(lists, dev)
    S = ext.shape[1]
    pos = torch.arange(S, device=dev)
    valid = pos[None, :] < sizes[:, None]  # (N, S)
    neg = torch.tensor(-math.inf, dtype=torch.float64, device=dev)
    em = log_probs.gather(2, ext[None].expand(T, N, S))  # (T, N, S) log-probability of each position
    em = torch.where(valid[None], em, neg)

    def shifted(row: Tensor, by: int) -> Tensor:  # row[s - by] (by > 0) or row[s + |by|], -inf outside
        out = torch.full_like(row, -math.inf)
        if by > 0:
            out[:, by:] = row[:, :-by]
        else:
            out[:, :by] = row[:, -by:]
        return out

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


def probability_space_nll(
    activations: Float[Tensor, "t n a"], targets, input_lengths, target_lengths, *, dtype=torch.float32,
) -> Tensor:
    """The loss from the probability-space recursion with per-frame rescaling (Graves), in ``dtype``.

    Not used by the kernels: a CPU model of step 6's arithmetic, to show where rescaling breaks.
    Each frame's alpha row is divided by its sum and ``log P`` collects the log of those sums; the
    row itself is still one float per position, so positions far less likely than the frame's
    best (by more than float's range) flush to zero and are lost for good.
    """
    T, N, A = activations.shape
    inputs, lengths = validate_lengths(input_lengths, target_lengths, batch=N, max_time=T)
    lists = _label_lists(targets, lengths, A)
    dev = activations.device
    probs = activations.detach().to(dtype).softmax(2)
    ext, sizes, skip_in, _ = _extended(lists, dev)
    S = ext.shape[1]
    pos = torch.arange(S, device=dev)
    valid = pos[None, :] < sizes[:, None]
    y = probs.gather(2, ext[None].expand(T, N, S)) * valid[None]
    alpha = torch.where(pos[None] <= 1, y[0], torch.zeros((), dtype=dtype, device=dev))
    log_scale = torch.zeros(N, dtype=torch.float64, device=dev)
    result = torch.full((N,), math.nan, dtype=torch.float64, device=dev)
    for t in range(T):
        if t > 0:
            prev = alpha
            s1 = torch.zeros_like(prev)
            s1[:, 1:] = prev[:, :-1]
            s2 = torch.zeros_like(prev)
            s2[:, 2:] = prev[:, :-2]
            alpha = (prev + s1 + s2 * skip_in) * y[t]
        total = alpha.sum(1)
        log_scale += torch.log(total.double())
        alpha = alpha / torch.where(total > 0, total, torch.ones_like(total))[:, None]
        done = torch.as_tensor(inputs - 1, device=dev) == t
        if done.any():
            end = alpha.gather(1, (sizes - 1)[:, None])[:, 0]
            before = torch.where(sizes > 1, alpha.gather(1, (sizes - 2).clamp(min=0)[:, None])[:, 0],
                                 torch.zeros_like(end))
            nll = -(log_scale + torch.log((end + before).double()))
            result = torch.where(done, nll, result)
    return result


def torch_ctc(
    activations: Float[Tensor, "t n a"], targets, input_lengths, target_lengths, *, zero_infinity: bool = False,
) -> tuple[Tensor, Tensor]:
    """torch's answer: ``F.ctc_loss(log_softmax(x), reduction="none")`` and autograd's gradient of its sum.

    torch picks its cuDNN path when the targets are int32 on the CPU (concatenated), every input
    length equals T, every target is shorter than 256 and no longer than its input; otherwise
    its native kernels. Lengths are passed as tuples so torch needs no device-to-host copy.
    """
    x = activations.detach().requires_grad_(True)
    loss = torch.nn.functional.ctc_loss(
        x.log_softmax(2), targets, tuple(int(v) for v in input_lengths), tuple(int(v) for v in target_lengths),
        blank=BLANK, reduction="none", zero_infinity=zero_infinity)
    (grad,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach(), grad


def errors(loss: Tensor, grad: Tensor, ref_loss: Tensor, ref_grad: Tensor) -> dict[str, float]:
    """How far a result is from the reference.

    ``mismatched``: utterances whose loss is finite in one and not in the other, plus utterances
    with a finite loss and a NaN in their gradient (0 for a correct result).
    ``loss_rel``: largest ``|loss - ref| / max(1, |ref|)`` over utterances finite in both.
    ``grad_rel``: ``||grad - ref|| / ||ref||`` over the frames of those utterances (norm-relative).
    """
    loss, grad = loss.detach().double().cpu(), grad.detach().double()
    ref_loss, ref_grad = ref_loss.detach().double().cpu(), ref_grad.detach().double()
    finite = torch.isfinite(ref_loss) & torch.isfinite(loss)
    mismatched = int((torch.isfinite(loss) != torch.isfinite(ref_loss)).sum())
    if finite.any():
        diff = (loss[finite] - ref_loss[finite]).abs() / ref_loss[finite].abs().clamp(min=1.0)
        loss_rel = float(diff.max())
        cols = finite.to(grad.device)
        g, r = grad[:, cols], ref_grad.to(grad.device)[:, cols]
        mismatched += int(torch.isnan(g).any(dim=0).any(dim=1).sum())
        denom = float(torch.linalg.vector_norm(r))
        grad_rel = float(torch.linalg.vector_norm(g - r)) / max(denom, 1e-300)
    else:
        loss_rel, grad_rel = 0.0, 0.0
    return {"loss_rel": loss_rel, "grad_rel": grad_rel, "mismatched": mismatched}


# --------------------------------------------------------------------------------------
# Launching the kernels
# --------------------------------------------------------------------------------------

#: Device type the kernels' tensors must live on.
KERNEL_DEVICE_TYPE = "cuda"

_SIG_SOFTMAX = ["ptr", "ptr", "i32", "i32"]
_SIG_ALPHA = ["ptr"] * 6 + ["i32"] * 4
_SIG_BETA = ["ptr"] * 12 + ["i32"] * 6
_SIG_STATS = ["ptr"] * 6 + ["i32"] * 5
_SIG_RECURSION = ["ptr"] * 6 + ["i32"] * 3
_SIG_GRAD = ["ptr"] * 13 + ["i32"] * 8
_SIG_STATS_SOFTMAX = ["ptr"] * 7 + ["i32"] * 5
_SIG_TARGET_GRAD = ["ptr"] * 13 + ["i32"] * 7
#: Signature of each kernel of steps 7 to 9, by name without template arguments.
_FUSED_SIGNATURES = {"ctc_fused_stats": _SIG_STATS, "ctc_fused_recursion": _SIG_RECURSION,
                     "ctc_branchless_recursion": _SIG_RECURSION, "ctc_fused_grad": _SIG_GRAD,
                     "ctc_stats_softmax": _SIG_STATS_SOFTMAX, "ctc_target_grad": _SIG_TARGET_GRAD,
                     "ctc_warps_recursion": _SIG_RECURSION}

_KERNELS: dict[tuple[str, str], cuda.CudaKernel] = {}


def _load(source: str, name_expressions: Sequence[str] = ()):
    """Compile (once per process) and load a source; template kernels are named explicitly."""
    return cuda.load(source, name_expressions=tuple(name_expressions))


def _kernels(source: str, wanted: Sequence[tuple[str, Sequence[str]]]) -> list:
    """Kernels (name, signature) of one source; the missing template instances are compiled in one call."""
    missing = [name for name, _ in wanted if (source, name) not in _KERNELS]
    if missing:
        module = _load(source, [name for name in missing if "<" in name])
        for name, signature in wanted:
            if (source, name) not in _KERNELS:
                _KERNELS[(source, name)] = module.kernel(name, signature)
    return [_KERNELS[(source, name)] for name, _ in wanted]


def preload(step: int, grains: Sequence[int] = (), layouts: Sequence[bool] = (False,),
            recursions: Sequence[str | None] = (None,)) -> None:
    """Compile several template instances in one NVRTC call: grain sizes ``grains`` of steps 4 to 6
    (in the ``layouts``), or positions per lane ``grains`` of steps 7 to 9 (with the ``recursions``)."""
    if step in (4, 5, 6):
        names = [n for vt in grains for blocked in layouts for n in kernel_names(step, vt, blocked)]
        _kernels(BLOCKED_SOURCE, [(n, _SIG_ALPHA if "alpha" in n else _SIG_BETA) for n in dict.fromkeys(names)])
    elif step in (7, 8, 9, 10):
        names = [n for v in grains for option in recursions for n in fused_kernel_names(step, v, option)]
        _kernels(FUSED_SOURCE, [(n, _FUSED_SIGNATURES[n.split("<")[0]]) for n in dict.fromkeys(names)])



def default_grain(max_positions: int) -> int:
    """warp-ctc's rule of thumb: about 128 threads per utterance, as many positions per thread as needed."""
    return min(max(1, math.ceil(max_positions / 128)), GRAIN_SIZES[-1])


def block_threads(max_positions: int, grain: int) -> int:
    """Threads per utterance for grain size ``grain``: enough to cover every position, in whole warps."""
    return 32 * math.ceil(math.ceil(max_positions / grain) / 32)


def warp_grain(max_positions: int) -> int:
    """Positions per lane for step 7: the smallest compiled V with 32 V >= 2 L_max + 1."""
    for v in WARP_GRAINS:
        if 32 * v >= max_positions:
            return v
    raise ValueError(f"{max_positions} positions do not fit one warp (at most {32 * WARP_GRAINS[-1]})")


def kernel_names(step: int, grain: int | None = None, blocked: bool = False) -> tuple[str, str]:
    """(alpha kernel, beta + gradient kernel) of steps 1 to 6, as NVRTC name expressions."""
    if step in (1, 2, 3):
        return f"ctc_alpha_step{step}", f"ctc_beta_grad_step{step}"
    if step in (4, 5, 6):
        if grain not in GRAIN_SIZES:
            raise ValueError(f"grain must be one of {GRAIN_SIZES}, got {grain!r}")
        layout = "true" if blocked else "false"
        beta = 6 if step == 6 else 4  # step 5 only changes the alpha kernel
        return f"ctc_alpha_step{step}<{grain}, {layout}>", f"ctc_beta_grad_step{beta}<{grain}, {layout}>"
    raise ValueError(f"steps 1 to 6 have alpha/beta kernels; got step {step!r}")


def recursion_name(v: int, option: str | None = None) -> str:
    """Name expression of the branch-free recursion (steps 8 and 9) with ``v`` positions per lane."""
    option = DEFAULT_RECURSION if option is None else option
    if option not in RECURSION_OPTIONS:
        raise ValueError(f"recursion must be one of {sorted(RECURSION_OPTIONS)}, got {option!r}")
    if v not in WARP_GRAINS:
        raise ValueError(f"positions per lane must be one of {WARP_GRAINS}, got {v!r}")
    prefetch, ftz, redux = RECURSION_OPTIONS[option]
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


def recursion_warps(max_positions: int, grain: int) -> int:
    """Warps per direction of step 10: enough for ``max_positions`` at ``grain`` positions per thread."""
    warps = math.ceil(max_positions / (32 * grain))
    if warps > MAX_RECURSION_WARPS:
        raise ValueError(f"{max_positions} positions need {warps} warps at {grain} per thread; "
                         f"at most {MAX_RECURSION_WARPS}")
    return warps


def _row_threads(num_classes: int) -> int:
    """Threads of the per-frame blocks of step 7 (a frame of A activations per block)."""
    return 64 if num_classes <= 512 else 256


def _target_threads(max_positions: int) -> int:
    """Threads of step 9's last pass (a frame's S positions per block; A does not matter)."""
    return 64 if max_positions <= 256 else 128


def _check_activations(activations: Tensor, batch: CTCTargets) -> None:
    if not isinstance(activations, Tensor):
        raise TypeError(f"activations must be a torch.Tensor, got {type(activations).__name__}")
    if activations.dtype != torch.float32:
        raise TypeError(f"activations must be float32, got {activations.dtype}")
    if activations.ndim != 3:
        raise ValueError(f"activations must be (T, N, A), got shape {tuple(activations.shape)}")
    if not activations.is_contiguous():
        raise ValueError("activations must be contiguous")
    T, N, A = activations.shape
    if N != batch.batch:
        raise ValueError(f"activations hold N = {N} utterances but the targets {batch.batch}")
    if A != batch.num_classes:
        raise ValueError(f"activations have A = {A} classes but the targets were prepared for {batch.num_classes}")
    if max(batch.input_lengths_host, default=0) > T:
        raise ValueError(f"input_lengths go up to {max(batch.input_lengths_host)} but activations have T = {T}")


def _check_device(activations: Tensor, batch: CTCTargets) -> None:
    if activations.device.type != KERNEL_DEVICE_TYPE:
        raise ValueError(f"activations must be on a CUDA device, got {activations.device}")
    if batch.device != activations.device:
        raise ValueError(f"targets were prepared on {batch.device} but activations are on {activations.device}")


def _output(out: Tensor | None, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.float32, device=like.device)
    if not isinstance(out, Tensor) or out.dtype != torch.float32 or tuple(out.shape) != shape:
        raise ValueError(f"{name} must be a float32 tensor of shape {shape}")
    if out.device != like.device or not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous and on {like.device}")
    return out


def ctc_loss(
    activations: Float[Tensor, "t n a"],
    targets: Int[Tensor, "..."] | CTCTargets,
    input_lengths=None,
    target_lengths=None,
    *,
    step: int = 7,
    zero_infinity: bool = False,
    grain: int | None = None,
    blocked: bool = False,
    recursion: str | None = None,
    out_loss: Float[Tensor, " n"] | None = None,
    out_grad: Float[Tensor, "t n a"] | None = None,
) -> tuple[Float[Tensor, " n"], Float[Tensor, "t n a"]]:
    """CTC loss per utterance and the gradient of its sum w.r.t. the activations, with step ``step``.

    ``targets`` is a :class:`CTCTargets` from :func:`prepare_targets` (then leave the lengths out),
    or raw targets and lengths (validated and prepared on every call). ``grain`` (positions per
    thread) and ``blocked`` (consecutive instead of strided positions) choose the instance of
    steps 4 to 6, and ``grain`` the positions per thread of step 10 (``BLOCK_GRAINS``);
    ``recursion`` (a key of ``RECURSION_OPTIONS``) the warp recursion of steps 8 and 9.
    ``out_loss`` / ``out_grad`` let a caller supply (say, poisoned) output buffers.
    """
    if step not in STEPS:
        raise ValueError(f"step must be one of {sorted(STEPS)}, got {step!r}")
    if isinstance(targets, CTCTargets):
        if input_lengths is not None or target_lengths is not None:
            raise ValueError("pass either prepared targets or targets with their lengths, not both")
        batch = targets
    else:
        if not isinstance(activations, Tensor) or activations.ndim != 3:
            raise ValueError("activations must be a (T, N, A) tensor")
        batch = prepare_targets(targets, input_lengths, target_lengths, num_classes=activations.shape[2],
                                max_time=activations.shape[0], device=activations.device,
                                batch_size=activations.shape[1])
    if (step in (1, 2, 3, 7, 8, 9) and (grain is not None or blocked)) or (step == 10 and blocked):
        raise ValueError(f"grain and blocked only apply to steps 4 to 6 (grain also to step 10), not step {step}")
    allowed = BLOCK_GRAINS if step == 10 else GRAIN_SIZES
    if grain is not None and grain not in allowed:
        raise ValueError(f"grain must be one of {allowed} for step {step}, got {grain!r}")
    if recursion is not None and (step not in (8, 9) or recursion not in RECURSION_OPTIONS):
        raise ValueError(f"recursion must be one of {sorted(RECURSION_OPTIONS)} and only applies to steps 8 "
                         f"and 9; got {recursion!r} for step {step}")
    _check_activations(activations, batch)
    T, N, A = activations.shape
    loss = _output(out_loss, "out_loss", (N,), activations)
    grad = _output(out_grad, "out_grad", (T, N, A), activations)
    if grad.untyped_storage().data_ptr() == activations.untyped_storage().data_ptr():
        raise ValueError("out_grad must not share memory with activations (the kernels read them after "
                         "writing the gradient)")
    _check_device(activations, batch)
    if step >= 7:
        _fused(activations, batch, loss, grad, zero_infinity, step, recursion, grain)
    else:
        _warpctc(activations, batch, loss, grad, step, zero_infinity, grain, blocked)
    return loss, grad


def _workspace(device: torch.device, parts: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> list[Tensor]:
    """Scratch tensors carved out of one allocation (one call to the allocator instead of several)."""
    offsets, total = [], 0
    for shape, dtype in parts:
        offsets.append(total)
        total += -(-math.prod(shape) * dtype.itemsize // 256) * 256  # 256-byte aligned segments
    buffer = torch.empty((max(total, 1),), dtype=torch.uint8, device=device)
    return [buffer[o:o + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
            for o, (shape, dtype) in zip(offsets, parts)]


def _warpctc(x: Tensor, batch: CTCTargets, loss: Tensor, grad: Tensor, step: int, zero_infinity: bool,
             grain: int | None, blocked: bool) -> None:
    T, N, A = x.shape
    smax, lmax, umax = batch.max_positions, batch.label_stride, batch.slot_stride
    rows = T * N
    # log-probabilities (steps 1-5) or probabilities (step 6), the alpha matrix, log-likelihoods
    probs, alphas, log_likelihood = _workspace(x.device, [((T, N, A), torch.float32), ((N, T, smax), torch.float32),
                                                          ((N,), torch.float64)])
    (softmax,) = _kernels(WARPCTC_SOURCE, [("ctc_softmax_rows" if step == 6 else "ctc_log_softmax_rows",
                                               _SIG_SOFTMAX)])
    softmax(((rows + 7) // 8,), (256,), x, probs, rows, A)
    if step <= 3:
        threads, alpha_smem = 128, 0
        alpha_name, beta_name = kernel_names(step)
        source = WARPCTC_SOURCE
    else:
        grain = default_grain(smax) if grain is None else grain
        alpha_name, beta_name = kernel_names(step, grain, blocked)
        threads = block_threads(smax, grain)
        if threads > 1024:
            raise ValueError(f"grain {grain} needs {threads} threads for {smax} positions; use a larger grain")
        alpha_smem = 0 if step == 4 else 2 * smax * 4
        source = BLOCKED_SOURCE
    alpha, beta = _kernels(source, [(alpha_name, _SIG_ALPHA), (beta_name, _SIG_BETA)])
    alpha((N,), (threads,), probs, batch.labels, batch.input_lengths, batch.target_lengths, alphas, log_likelihood,
          T, N, A, lmax, shared_mem=alpha_smem)
    beta((N,), (threads,), probs, batch.labels, batch.input_lengths, batch.target_lengths, batch.slot_class,
         batch.slot_start, batch.slot_members, batch.num_slots, alphas, log_likelihood, grad, loss,
         T, N, A, lmax, umax, int(zero_infinity), shared_mem=3 * smax * 4)


def _workspace_addresses(device: torch.device, nbytes: Sequence[int]) -> tuple[Tensor, list[int]]:
    """One allocation carved into 256-byte aligned segments, returned as device addresses: the
    launcher takes plain integers for pointers, and building tensor views costs microseconds of
    Python per call. The caller keeps the buffer alive until the launches are queued (the caching
    allocator only hands the memory out again in stream order)."""
    offsets, total = [], 0
    for size in nbytes:
        offsets.append(total)
        total += -(-size // 256) * 256
    buffer = torch.empty((max(total, 1),), dtype=torch.uint8, device=device)
    base = buffer.data_ptr()
    return buffer, [base + o for o in offsets]


_FUSED_LAUNCH: dict[tuple[int, int, str | None], list] = {}


def _fused(x: Tensor, batch: CTCTargets, loss: Tensor, grad: Tensor, zero_infinity: bool, step: int,
           recursion: str | None, grain: int | None = None) -> None:
    T, N, A = x.shape
    smax, lmax, umax = batch.max_positions, batch.label_stride, batch.slot_stride
    if step == 10:  # a block of warps per direction, ``v`` positions per thread
        v = DEFAULT_BLOCK_GRAIN if grain is None else grain
        recursion_threads = 32 * recursion_warps(smax, v)
    else:  # one warp per direction, ``v`` positions per lane
        v = warp_grain(smax)
        recursion_threads = 32
    row_stride = recursion_threads * v
    key = (step, v, recursion)
    kernels = _FUSED_LAUNCH.get(key)
    if kernels is None:
        names = fused_kernel_names(step, v, recursion)
        kernels = _FUSED_LAUNCH[key] = _kernels(FUSED_SOURCE, [(n, _FUSED_SIGNATURES[n.split("<")[0]]) for n in names])
    first, warp_recursion, last = kernels
    vectorised = int(A % 4 == 0 and x.data_ptr() % 16 == 0 and grad.data_ptr() % 16 == 0)
    threads = _row_threads(A)
    buffer, (row_lse, emissions, rows, row_shift) = _workspace_addresses(
        x.device, [T * N * 4, N * T * (lmax + 1) * 4, 2 * N * T * row_stride * 4, 2 * N * T * 8])
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
        last((T * N,), (_target_threads(smax),), x, row_lse, emissions, rows, row_shift, input_lengths,
             target_lengths, batch.slot_class, batch.slot_start, batch.slot_members, batch.num_slots, grad, loss,
             T, N, A, lmax, umax, row_stride, int(zero_infinity))
    else:
        last((T * N,), (threads,), x, row_lse, emissions, rows, row_shift, input_lengths, target_lengths,
             batch.slot_class, batch.slot_start, batch.slot_members, batch.num_slots, grad, loss,
             T, N, A, lmax, umax, row_stride, vectorised, int(zero_infinity))
    del buffer  # queued: the memory may be reused by the next allocation on this stream


# --------------------------------------------------------------------------------------
# Looking at the compiled code (runs on the CPU: NVRTC needs no GPU)
# --------------------------------------------------------------------------------------

def compile_step(step: int, *, grains: Sequence[int] = (), layouts: Sequence[bool] = (False,),
                 recursions: Sequence[str | None] = (None,), arch: str = cuda.DEFAULT_ARCH) -> cuda.CompiledSource:
    """NVRTC output (PTX, cubin, ptxas report) of a step's source, with the requested grain sizes
    (positions per lane for steps 7 to 9, with the recursion options ``recursions`` for 8 and 9)."""
    if step in (1, 2, 3):
        return cuda.compile_source(WARPCTC_SOURCE, arch=arch)
    if step in (4, 5, 6):
        names = [n for vt in grains for b in layouts for n in kernel_names(step, vt, b)]
        return cuda.compile_source(BLOCKED_SOURCE, arch=arch, name_expressions=list(dict.fromkeys(names)))
    if step in (7, 8, 9, 10):
        names = [fused_kernel_names(step, v, option)[1] for v in grains
                 for option in (recursions if step in (8, 9) else (None,))]
        return cuda.compile_source(FUSED_SOURCE, arch=arch, name_expressions=list(dict.fromkeys(names)))
    raise ValueError(f"step must be one of {sorted(STEPS)}, got {step!r}")


def global_loads(ptx_function: str) -> dict[str, int]:
    """Global loads in one PTX function: coherent ``ld.global`` versus read-only ``ld.global.nc``."""
    nc = len(re.findall(r"^\s*(?:@%p\d+\s+)?ld\.global\.nc\b", ptx_function, flags=re.MULTILINE))
    every = len(re.findall(r"^\s*(?:@%p\d+\s+)?ld\.global\b", ptx_function, flags=re.MULTILINE))
    return {"ld.global": every - nc, "ld.global.nc": nc}


def load_table(compiled: cuda.CompiledSource, kernels: Sequence[str]) -> list[dict[str, object]]:
    """For each kernel: its loads (coherent / non-coherent) and ptxas' registers and spills."""
    report = compiled.ptxas_report()
    rows = []
    for name in kernels:
        mangled = compiled.lowered_names.get(name, name)
        loads = global_loads(compiled.ptx_function(name))
        rows.append({"kernel": name, **loads, **report.get(mangled, {})})
    return rows


def nvdisasm_path() -> Path | None:
    """``nvdisasm`` from a CUDA toolkit on the PATH, or the copy Triton's wheel bundles; None if neither."""
    found = shutil.which("nvdisasm")
    if found:
        return Path(found)
    try:
        import triton
    except ImportError:  # pragma: no cover - triton is a dependency
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    return bundled if bundled.is_file() else None


def sass(compiled: cuda.CompiledSource) -> dict[str, list[str]]:
    """The SASS (machine code) of every kernel of a cubin, as opcode lines per mangled kernel name.

    Needs ``nvdisasm`` (see :func:`nvdisasm_path`); raises ``FileNotFoundError`` without it.
    """
    tool = nvdisasm_path()
    if tool is None:
        raise FileNotFoundError("nvdisasm not found (neither on the PATH nor in Triton's wheel)")
    if compiled.cubin is None:
        raise ValueError("SASS needs a cubin: compile for an sm_XX target")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(compiled.cubin)
        handle.flush()
        text = subprocess.run([str(tool), "-c", handle.name], check=True, capture_output=True, text=True).stdout
    kernels: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^\s*\.text\.(\S+):\s*$", line)
        if m:
            current = kernels.setdefault(m.group(1), [])
            continue
        m = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if m and current is not None:
            current.append(re.sub(r"^@!?U?P[T0-9]+\s+", "", m.group(1)))  # drop the predicate
    return kernels


def sass_counts(compiled: cuda.CompiledSource, kernels: Sequence[str]) -> list[dict[str, object]]:
    """Per kernel: SASS instructions, divergent regions (``BSSY``, one per branch the warp may split
    at), transcendental ops (``MUFU``: ex2, lg2), shuffles (``SHFL``) and warp reductions (``REDUX``)."""
    code = sass(compiled)
    rows = []
    for name in kernels:
        ops = code[compiled.lowered_names.get(name, name)]
        first = [op.split()[0] for op in ops]
        rows.append({"kernel": name, "instructions": len(ops),
                     "BSSY": sum(f == "BSSY" for f in first),
                     "MUFU": sum(f.startswith("MUFU") for f in first),
                     "SHFL": sum(f.startswith("SHFL") for f in first),
                     "REDUX": sum(f.startswith("REDUX") for f in first)})
    return rows


def markdown(rows: Sequence[dict[str, object]]) -> str:
    """A list of same-keyed dicts as a Markdown table."""
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(f"`{r[k]}`" if k == "kernel" else str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def bank_ways(grain: int, blocked: bool, threads: int = 128) -> int:
    """Shared-memory bank conflicts of one warp-wide access to the rows of steps 4 to 6 (a model).

    Each of the 32 lanes reads its i-th position (the worst i is taken); 32 banks of 4 bytes. The
    strided layout (s = tid + i * threads) puts neighbouring lanes on neighbouring words: 1-way
    for every grain. The blocked layout (s = tid * VT + i) has a stride of VT words: gcd(VT, 32)
    lanes share a bank, so even grains conflict and odd ones do not (ModernGPU's advice).
    """
    worst = 1
    for i in range(grain):
        words = [(lane * grain + i) if blocked else (lane + i * threads) for lane in range(32)]
        banks = [w % 32 for w in words]
        worst = max(worst, max(banks.count(b) for b in set(banks)))
    return worst


# --------------------------------------------------------------------------------------
# Inputs, bytes, benchmark
# --------------------------------------------------------------------------------------

BENCH_T = 150
BENCH_N = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BENCH_A = (28, 5000)
#: Utterances of the grain-size sweep.
SWEEP_N = 64
#: Utterance lengths of the rescaling stress test (targets of T / 3 labels, blank-heavy frames).
STRESS_T = (50, 100, 200, 400)
STRESS_A, STRESS_N = 28, 8
BENCH_DEVICE = "cuda"
#: Batch sizes at which every recursion option of the last step is measured.
VARIANT_N = BENCH_N
#: (A, N) where the benchmark also records per-kernel device times, host time per call and the
#: time of a CUDA-graph replay (no Python in the loop) for steps 7 to 9.
PROFILE_CASES = ((28, 1), (28, 2), (28, 256), (5000, 2), (5000, 256))
#: Targets (and the tolerance of the checks) for the log-space steps.
LOSS_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-4


def random_targets(T: int, N: int, A: int, generator: torch.Generator, max_length: int = 255) -> list[np.ndarray]:
    """Target label sequences as in the seed's benchmark: length uniform in [1, min(T, max_length)],
    labels uniform in [1, A), shortened until they fit T frames (a blank between repeats); all valid
    for torch's cuDNN path (shorter than 256, no longer than the input)."""
    lists = []
    for _ in range(N):
        length = int(torch.randint(1, min(T, max_length) + 1, (1,), generator=generator))
        labels = torch.randint(1, A, (length,), generator=generator).numpy().astype(np.int64)
        while min_frames(labels) > T:
            labels = labels[:-1]
        lists.append(labels)
    return lists


def padded(lists: Sequence[np.ndarray], dtype=torch.int64) -> Tensor:
    """Label lists as an (N, L_max) tensor padded with the blank."""
    width = max([len(l) for l in lists] + [1])
    out = torch.zeros((len(lists), width), dtype=dtype)
    for i, labels in enumerate(lists):
        out[i, :len(labels)] = torch.from_numpy(np.asarray(labels, np.int64)).to(dtype)
    return out


def concatenated(lists: Sequence[np.ndarray], dtype=torch.int32) -> Tensor:
    flat = np.concatenate([np.asarray(labels, np.int64) for labels in lists] + [np.zeros(0, np.int64)])
    return torch.from_numpy(flat).to(dtype)


def dram_bytes(T: int, N: int, A: int) -> int:
    """The unavoidable traffic: read the activations once and write the gradient once (float32)."""
    return 2 * 4 * T * N * A


def _torch_timed(x: Tensor, targets: Tensor, lengths_in: tuple, lengths_out: tuple):
    """log_softmax + ctc_loss + backward to the activations: what a training step pays in torch."""
    def run():
        leaf = x.detach().requires_grad_(True)
        loss = torch.nn.functional.ctc_loss(leaf.log_softmax(2), targets, lengths_in, lengths_out, blank=BLANK,
                                            reduction="sum")
        return torch.autograd.grad(loss, leaf)[0]
    return run


def _torch_kernel_names(fn) -> list[str]:
    """Names of the CUDA kernels one call of ``fn`` launches (to tell torch's two paths apart)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages()})


def _short_kernel_name(name: str) -> str:
    """``void ctc_branchless_recursion<10, 4, true, true>(float const*, ...)`` -> ``ctc_branchless_recursion<10, 4, true, true>``."""
    name = name.removeprefix("void ")
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def kernel_times_us(fn, calls: int = 10) -> dict[str, float]:
    """Mean device time per call (µs) of every kernel or copy ``fn`` runs, from torch.profiler (CUPTI).
    No L2 flush between calls, unlike the benchmark's timings."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    from torch.autograd import DeviceType

    times: dict[str, float] = {}
    for event in prof.key_averages():
        # only work that ran on the device: API calls (cudaLaunchKernel, cuLaunchKernel, ...) may carry
        # the time of the kernel they launched, which would count it twice
        if getattr(event, "device_type", DeviceType.CUDA) != DeviceType.CUDA or re.match(r"cu(da)?[A-Z]", event.key):
            continue
        total = getattr(event, "device_time_total", None)
        total = getattr(event, "cuda_time_total", 0.0) if total is None else total
        if total:
            key = _short_kernel_name(event.key)
            times[key] = times.get(key, 0.0) + total / calls
    return times


def host_us(fn, calls: int = 30) -> float:
    """Python/driver time (µs) to *queue* one call of ``fn``, measured while the GPU is held busy, so
    that nothing waits for the GPU: the cost a call has even when its kernels take no time."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # tens of ms of spinning: the queue never drains while we time
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def graph_replay(fn):
    """``fn`` captured once in a CUDA graph; returns the replay function (GPU work without Python)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def stress_inputs(T: int, N: int, A: int, generator: torch.Generator, device) -> tuple[Tensor, list[np.ndarray]]:
    """Long utterances whose frames strongly prefer the blank, with targets that must still be
    emitted (L about T / 3): the surviving alignments are, at every frame, far less likely than
    the best partial path, which is exactly what per-frame rescaling in float32 cannot hold."""
    x = torch.randn((T, N, A), generator=generator) * 2.0
    x[:, :, BLANK] += 6.0
    lists = [torch.randint(1, A, (min(T // 3, MAX_TARGET_LENGTH),), generator=generator).numpy() for _ in range(N)]
    return x.to(device), lists


def bench(run) -> None:
    """Forward + backward from activations for T = 150, N = 1..256, A in {28, 5000}: torch's cuDNN
    and native paths and the ten steps (with step 9's other recursion options and step 10's other
    grain at every N, and per-kernel, host and CUDA-graph times at a few points); then the grain-size
    sweep and the rescaling stress test."""
    started = time.perf_counter()
    device = torch.device(BENCH_DEVICE)
    ns = (BENCH_N[0], BENCH_N[len(BENCH_N) // 2], BENCH_N[-1]) if run.quick else BENCH_N
    generator = torch.Generator().manual_seed(2024)
    T = BENCH_T
    torch.backends.cudnn.enabled = True
    paths_checked: set[int] = set()
    profile_points: list = []
    # the positions per lane these inputs need, compiled in three NVRTC calls instead of one per new shape
    preload(7, (4, 6, 8, 10))
    preload(OPTIONS_STEP, (4, 6, 8, 10), recursions=list(RECURSION_OPTIONS))
    preload(10, BLOCK_GRAINS)
    for A in BENCH_A:
        for N in run.progress(ns, f"A={A}"):
            lists = random_targets(T, N, A, generator)
            x = torch.randn((T, N, A), generator=generator).to(device)
            lengths_in = (T,) * N
            lengths_out = tuple(len(l) for l in lists)
            params = {"T": T, "N": N, "A": A}
            floor = run.floor_ms(dram_bytes(T, N, A))
            ref_loss, ref_grad = reference_ctc(x, padded(lists).to(device), lengths_in, lengths_out)
            cudnn_targets = concatenated(lists, torch.int32)  # int32, CPU, concatenated: cuDNN's conditions
            native_targets = padded(lists, torch.int64).to(device)
            baselines = {"torch-cuDNN": _torch_timed(x, cudnn_targets, lengths_in, lengths_out),
                         "torch-native": _torch_timed(x, native_targets, lengths_in, lengths_out)}
            if A not in paths_checked:  # which kernels does each torch path launch?
                paths_checked.add(A)
                names = {k: _torch_kernel_names(fn) for k, fn in baselines.items()}
                marker = "ctc_loss_log_alpha"  # torch's native forward kernel
                run.check("torch-native runs torch's native CTC kernels",
                          any(marker in n for n in names["torch-native"]), params=params,
                          kernels=names["torch-native"])
                run.check("torch-cuDNN runs cuDNN's CTC (no native CTC kernel)",
                          not any(marker in n for n in names["torch-cuDNN"]), params=params,
                          kernels=names["torch-cuDNN"])
            best = math.inf
            for series, fn in baselines.items():
                grad = fn()
                loss = torch.nn.functional.ctc_loss(x.log_softmax(2), cudnn_targets if "cuDNN" in series else
                                                    native_targets, lengths_in, lengths_out, reduction="none")
                err = errors(loss, grad, ref_loss, ref_grad)
                err["infinite_losses"] = int((~torch.isfinite(loss)).sum())
                ms = run.time(fn)
                best = min(best, ms)
                run.record(series, ms, params=params, role="baseline", floor_ms=floor, **err)
            run.record("torch-best", best, params=params, role="baseline", floor_ms=floor,
                       note="the faster of torch-cuDNN and torch-native in this run")
            batch = prepare_targets(padded(lists), lengths_in, lengths_out, num_classes=A, max_time=T, device=device)
            shape = {"max_positions": batch.max_positions, "positions_per_lane": warp_grain(batch.max_positions)}
            block_shape = {"max_positions": batch.max_positions, "positions_per_lane": DEFAULT_BLOCK_GRAIN,
                           "warps": recursion_warps(batch.max_positions, DEFAULT_BLOCK_GRAIN)}
            for step in STEPS:
                loss, grad = ctc_loss(x, batch, step=step)
                err = errors(loss, grad, ref_loss, ref_grad)
                err["infinite_losses"] = int((~torch.isfinite(loss)).sum())
                if step != 6:  # probability space is measured, not held to the log-space targets
                    run.check(f"step{step} matches the float64 reference", err["mismatched"] == 0 and
                              err["loss_rel"] <= LOSS_TOLERANCE and err["grad_rel"] <= GRAD_TOLERANCE,
                              params=params, **err)
                del loss, grad
                ms = run.time(lambda: ctc_loss(x, batch, step=step))
                run.record(f"step{step}", ms, params=params, floor_ms=floor, title=STEPS[step],
                           **(block_shape if step == 10 else shape), **err)
            if N in VARIANT_N:  # the other recursion options of step 9, and step 10's other grain
                variants = [(f"step{OPTIONS_STEP} recursion {o}", {"step": OPTIONS_STEP, "recursion": o},
                             {"options": dict(zip(("prefetch", "ftz", "redux"), RECURSION_OPTIONS[o])), **shape})
                            for o in RECURSION_OPTIONS if o != DEFAULT_RECURSION]
                variants += [(f"step10 grain {g}", {"step": 10, "grain": g},
                              {**block_shape, "positions_per_lane": g,
                               "warps": recursion_warps(batch.max_positions, g)})
                             for g in BLOCK_GRAINS if g != DEFAULT_BLOCK_GRAIN]
                for series, how, extra in variants:
                    loss, grad = ctc_loss(x, batch, **how)
                    err = errors(loss, grad, ref_loss, ref_grad)
                    run.check(f"{series} matches the float64 reference", err["mismatched"] == 0 and
                              err["loss_rel"] <= LOSS_TOLERANCE and err["grad_rel"] <= GRAD_TOLERANCE,
                              params=params, **err)
                    del loss, grad
                    ms = run.time(lambda: ctc_loss(x, batch, **how))
                    run.record(series, ms, params=params, floor_ms=floor, **extra, **err)
            if (A, N) in PROFILE_CASES:  # profiled at the very end, on these same inputs
                profile_points.append((x, batch, baselines, params))
            del x, ref_grad, batch
            torch.cuda.empty_cache()

    # grain sizes: odd and even VT, strided (warp-ctc) and blocked positions
    sweep_n = SWEEP_N
    for A in BENCH_A:
        lists = random_targets(T, sweep_n, A, generator)
        x = torch.randn((T, sweep_n, A), generator=generator).to(device)
        lengths_out = tuple(len(l) for l in lists)
        batch = prepare_targets(padded(lists), (T,) * sweep_n, lengths_out, num_classes=A, max_time=T, device=device)
        ref_loss, ref_grad = reference_ctc(x, padded(lists).to(device), (T,) * sweep_n, lengths_out)
        grains = [g for g in (GRAIN_SIZES[:4] if run.quick else GRAIN_SIZES)
                  if block_threads(batch.max_positions, g) <= 1024]
        for step, layout in run.progress([(4, False), (5, False), (5, True)], f"grain sweep A={A}"):
            preload(step, grains, (layout,))
            for vt in grains:
                params = {"T": T, "N": sweep_n, "A": A, "grain": vt}
                loss, grad = ctc_loss(x, batch, step=step, grain=vt, blocked=layout)
                err = errors(loss, grad, ref_loss, ref_grad)
                run.check(f"step{step} grain {vt} {'blocked' if layout else 'strided'} matches the reference",
                          err["mismatched"] == 0 and err["loss_rel"] <= LOSS_TOLERANCE and
                          err["grad_rel"] <= GRAD_TOLERANCE, params=params, **err)
                del loss, grad
                ms = run.time(lambda: ctc_loss(x, batch, step=step, grain=vt, blocked=layout))
                run.record(f"step{step} {'blocked' if layout else 'strided'}", ms, params=params,
                           threads=block_threads(batch.max_positions, vt), **err)
        del x, ref_grad, batch
        torch.cuda.empty_cache()

    # where per-frame rescaling breaks: accuracy of step 6 (and step 5) as utterances get longer
    A, N = STRESS_A, STRESS_N
    for T_long in run.progress(STRESS_T[::2] if run.quick else STRESS_T, "rescaling stress"):
        x, lists = stress_inputs(T_long, N, A, generator, device)
        lengths_out = tuple(len(l) for l in lists)
        batch = prepare_targets(padded(lists), (T_long,) * N, lengths_out, num_classes=A, max_time=T_long,
                                device=device)
        ref_loss, ref_grad = reference_ctc(x, padded(lists).to(device), (T_long,) * N, lengths_out)
        for step in (5, 6, 7, 8, 9, 10):
            loss, grad = ctc_loss(x, batch, step=step)
            err = errors(loss, grad, ref_loss, ref_grad)
            if step != 6:
                run.check(f"step{step} matches the reference on long utterances",
                          err["mismatched"] == 0 and err["loss_rel"] <= LOSS_TOLERANCE and
                          err["grad_rel"] <= GRAD_TOLERANCE, params={"T": T_long, "N": N, "A": A}, **err)
            ms = run.time(lambda: ctc_loss(x, batch, step=step), rep=50)
            run.record(f"stress step{step}", ms, params={"T": T_long, "N": N, "A": A},
                       infinite_losses=int((~torch.isfinite(loss)).sum()), **err)
        del x, ref_grad, batch
        torch.cuda.empty_cache()
    run.note("Timed calls take prepared targets (CTCTargets on the GPU); torch-native gets int64 GPU targets and "
             "both torch paths get lengths as tuples, so no call copies lengths from the device.")
    run.note(f"Recursion options of steps 8 and 9 (prefetch, ftz, redux): {RECURSION_OPTIONS}; "
             f"steps 8 and 9 use {DEFAULT_RECURSION!r}. Step 10 uses {DEFAULT_BLOCK_GRAIN} positions per thread.")
    # last, so that nothing it might break (a failed graph capture) can cost the measurements above
    for x, batch, baselines, params in run.progress(profile_points, "kernel times, host time, CUDA graphs"):
        _profile_point(run, x, batch, baselines, params)
    run.note(f"The ctc benchmark took {time.perf_counter() - started:.0f} s.")


def _profile_point(run, x: Tensor, batch: CTCTargets, baselines: dict, params: dict) -> None:
    """Per-kernel device times, host time per call and CUDA-graph replay time at one point."""
    calls = {"torch-cuDNN": baselines["torch-cuDNN"], "torch-native": baselines["torch-native"]}
    calls.update({f"step{step}": (lambda step=step: ctc_loss(x, batch, step=step)) for step in (7, 8, 9, 10)})
    for series, fn in calls.items():
        try:
            kernels = kernel_times_us(fn)
            run.record(f"{series} kernels", sum(kernels.values()) / 1e3, params=params,
                       role="baseline" if series.startswith("torch") else "kernel", kernels_us=kernels,
                       method="torch.profiler: device time per call, summed over kernels and copies (no L2 flush)")
        except Exception as exc:  # the profile is extra information: never lose the run to it
            run.note(f"profiling {series} at {params} failed: {exc!r}")
        try:
            queued = host_us(fn)
            # a call that waits for the GPU inside waits for the spinning kernel: far above any queuing cost
            run.record(f"{series} host", queued / 1e3, params=params, role="baseline" if series.startswith("torch")
                       else "kernel", synchronises=queued > 1000.0,
                       method="time.perf_counter: Python and driver time to queue one call, GPU held busy")
        except Exception as exc:
            run.note(f"host time of {series} at {params} failed: {exc!r}")
        if series.startswith("torch"):
            continue
        try:
            run.record(f"{series} graph", run.time(graph_replay(fn)), params=params,
                       method="do_bench of a CUDA-graph replay of one call (no Python between the kernels)")
        except Exception as exc:
            run.note(f"CUDA graph of {series} at {params} failed: {exc!r}")


# --------------------------------------------------------------------------------------
# Figures (from the committed benchmark JSON)
# --------------------------------------------------------------------------------------

MAIN_SERIES = ["torch-cuDNN", "torch-native"] + [f"step{k}" for k in STEPS]


def figures(results) -> dict[str, "matplotlib.figure.Figure"]:  # noqa: F821
    import matplotlib.pyplot as plt

    from studylog import plotting

    figs = {}
    for A in BENCH_A:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        plotting.plot_times(results, "N", MAIN_SERIES, where={"A": A}, ax=ax,
                            title=f"CTC loss + gradient, T = {BENCH_T}, A = {A} ({results.gpu})")
        figs[f"times_A{A}"] = fig
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for ax, A in zip(axes, BENCH_A):
        plotting.plot_speedup(results, "N", "torch-best", [f"step{k}" for k in STEPS], where={"A": A}, ax=ax,
                              title=f"speedup over the faster torch path, A = {A} (dashed: the target)")
        ax.axhline(2.0 if A == 5000 else 1.0, color="tab:red", lw=1, ls="--")
    axes[0].get_legend().remove()  # one legend, beside the plots, where it hides no line
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    figs["speedup"] = fig
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, A in zip(axes, BENCH_A):
        plotting.plot_times(results, "grain", ["step4 strided", "step5 strided", "step5 blocked"],
                            where={"A": A}, ax=ax, logx=False, logy=False, floor=False,
                            title=f"grain size (positions per thread), N = 64, A = {A}")
    fig.tight_layout()
    figs["grain"] = fig
    rows = [r for r in results.rows if r["series"].startswith("stress ")]
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for series in sorted({r["series"] for r in rows}):
            pts = sorted((r["params"]["T"], max(r["loss_rel"], 1e-12)) for r in rows if r["series"] == series)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=series.removeprefix("stress "))
            for r in rows:
                if r["series"] == series and r["infinite_losses"]:
                    ax.annotate(f"{r['infinite_losses']} inf", (r["params"]["T"], max(r["loss_rel"], 1e-12)),
                                fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(LOSS_TOLERANCE, color="k", lw=1, ls=":", label="tolerance of the log-space steps")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("T (frames); targets of T / 3 labels, blank-heavy frames")
        ax.set_ylabel("largest relative loss error")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"log space vs probability space on long utterances ({results.gpu})", fontsize=10)
        figs["rescaling"] = fig
    if any(results.select(f"step{step} kernels") for step in (7, 8, 9, 10)):
        figs["kernels"] = _kernel_breakdown_figure(results)
    bars = recursion_series()
    if any(results.select(series) for series, label in bars if "default" not in label):
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
        for ax, A in zip(axes, BENCH_A):
            ns = sorted({r["params"]["N"] for series, _ in bars for r in results.select(series, A=A)})
            width = 0.84 / len(bars)
            for i, (series, label) in enumerate(bars):
                ys = [(results.select(series, A=A, N=n) or [{"ms": float("nan")}])[0]["ms"] * 1e3 for n in ns]
                ax.bar([j + (i - (len(bars) - 1) / 2) * width for j in range(len(ns))], ys, width, label=label)
            ax.set_xticks(range(len(ns)), [str(n) for n in ns])
            ax.set_xlabel("N")
            ax.set_yscale("log")
            ax.set_ylabel("time (µs, median)")
            ax.set_title(f"the recursion's options, A = {A}", fontsize=10)
            ax.legend(fontsize=7)
            ax.grid(True, axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        figs["recursion_options"] = fig
    return figs


def recursion_series() -> list[tuple[str, str]]:
    """(series, label) of every recursion measured between step 9's two passes: the options of the
    branch-free warp (step 9 itself uses the default) and step 10's block of warps."""
    out = []
    for option in RECURSION_OPTIONS:
        series = f"step{OPTIONS_STEP}" if option == DEFAULT_RECURSION else f"step{OPTIONS_STEP} recursion {option}"
        out.append((series, f"step {OPTIONS_STEP}, {option}" + (" (default)" if option == DEFAULT_RECURSION else "")))
    for grain in BLOCK_GRAINS:
        series = "step10" if grain == DEFAULT_BLOCK_GRAIN else f"step10 grain {grain}"
        out.append((series, f"step 10, {grain} per thread" + (" (default)" if grain == DEFAULT_BLOCK_GRAIN else "")))
    return out


def _kernel_role(name: str) -> str:
    if "recursion" in name:
        return "recursion"
    if name.startswith("ctc_"):
        return "first pass" if ("stats" in name) else "last pass"
    return "other"


def _kernel_breakdown_figure(results):
    """Stacked per-kernel device times of steps 7 to 10 at the profiled points, with the benchmark's
    median (do_bench, L2 flushed) and the CUDA-graph replay as markers."""
    import matplotlib.pyplot as plt

    cases = sorted({(r["params"]["A"], r["params"]["N"]) for step in (7, 8, 9, 10)
                    for r in results.select(f"step{step} kernels")})
    steps = [7, 8, 9, 10]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    colors = {"first pass": "tab:blue", "recursion": "tab:orange", "last pass": "tab:green", "other": "tab:gray"}
    width = 0.8 / len(steps)
    used = set()
    for j, (A, N) in enumerate(cases):
        for i, step in enumerate(steps):
            rows = results.select(f"step{step} kernels", A=A, N=N)
            if not rows:
                continue
            xpos = j + (i - (len(steps) - 1) / 2) * width
            bottom = 0.0
            for name, us in sorted(rows[0]["kernels_us"].items(), key=lambda kv: ("first", "recursion", "last",
                                   "other").index(_kernel_role(kv[0]).split()[0])):
                role = _kernel_role(name)
                ax.bar(xpos, us, width * 0.9, bottom=bottom, color=colors[role],
                       label=role if role not in used else None)
                used.add(role)
                bottom += us
            timed = results.select(f"step{step}", A=A, N=N)
            top = max([bottom] + [r["ms"] * 1e3 for r in timed + results.select(f"step{step} graph", A=A, N=N)])
            ax.text(xpos, top * 1.12, str(step), ha="center", va="bottom", fontsize=7)
            if timed:
                ax.plot(xpos, timed[0]["ms"] * 1e3, "k_", ms=12, mew=2,
                        label="benchmark median" if "median" not in used else None)
                used.add("median")
            graph = results.select(f"step{step} graph", A=A, N=N)
            if graph:
                ax.plot(xpos, graph[0]["ms"] * 1e3, "rv", ms=5, label="CUDA-graph replay" if "graph" not in used else None)
                used.add("graph")
    ax.set_xticks(range(len(cases)), [f"A = {A}, N = {N}" for A, N in cases])
    ax.set_yscale("log")
    ax.set_ylabel("µs per call")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"device time per kernel of steps 7 to 10 (torch.profiler) against the timed call ({results.gpu})",
                 fontsize=10)
    return fig


def headline(results) -> list[dict]:
    """The book's headline rows: the last step against the faster torch path, at the smallest speedup
    over N for each alphabet, and at the largest batch of the large alphabet."""
    steps = [k for k in sorted(STEPS, reverse=True) if results.select(f"step{k}")]
    if not steps:
        return []
    step = steps[0]
    rows = []
    for A in BENCH_A:
        ratios = {r["params"]["N"]: r["ms"] / results.ms(f"step{step}", **r["params"])
                  for r in results.select("torch-best", A=A, T=BENCH_T) if results.select(f"step{step}", **r["params"])}
        if not ratios:
            continue
        worst = min(ratios, key=ratios.get)
        rows.append({"kernel": f"step {step} ({STEPS[step]}, CUDA C++)", "baseline": "faster of torch cuDNN / native",
                     "case": f"T = {BENCH_T}, A = {A}, N = {worst} (smallest speedup over N = "
                             f"{min(ratios)}..{max(ratios)})", "speedup": ratios[worst]})
        if A == max(BENCH_A):
            n = max(ratios)
            rows.append({"kernel": f"step {step} ({STEPS[step]}, CUDA C++)", "baseline": "faster of torch cuDNN / native",
                         "case": f"T = {BENCH_T}, A = {A}, N = {n}", "speedup": ratios[n]})
    return rows[:3]
