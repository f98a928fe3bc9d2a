"""Chapter 4's targets, validated and packed for the kernels once per batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from studylog import runtime

BLANK = 0
#: Longest target the kernels accept (2 L + 1 <= 1023 positions: one warp holds 32 x 32 of them).
MAX_TARGET_LENGTH = 511


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


def label_lists(targets: Tensor, target_lengths: np.ndarray, num_classes: int) -> list[np.ndarray]:
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
    """Targets validated and packed for the kernels (:func:`prepare_targets`). The ``slot`` arrays list each
    utterance's distinct classes (slot 0: the blank) and their target positions: the gradient needs no atomics."""

    num_classes: int
    max_time: int
    # Each device array (int32: what the kernels read) beside the host values it was built from.
    input_lengths_host: tuple[int, ...]
    input_lengths: Int[Tensor, " n"]
    target_lengths_host: tuple[int, ...]
    target_lengths: Int[Tensor, " n"]
    label_lists: tuple[np.ndarray, ...]
    label_stride: int  # columns of ``labels`` (>= 1): the kernels' L_max
    labels: Int[Tensor, "n lmax"]
    slot_stride: int  # columns of ``slot_class`` (>= 1): the kernels' U_max
    slot_class: Int[Tensor, "n umax"]
    slot_start: Int[Tensor, "n umax_plus_1"]
    slot_members: Int[Tensor, "n lmax"]
    num_slots: Int[Tensor, " n"]

    @property
    def batch(self) -> int:
        return len(self.input_lengths_host)

    @property
    def max_positions(self) -> int:
        """``2 L_max + 1``: the entries of a row of alpha and beta."""
        return 2 * self.label_stride + 1

    @property
    def device(self) -> torch.device:
        return self.labels.device


def prepare_targets(targets: Int[Tensor, "..."], input_lengths, target_lengths, *, num_classes: int, max_time: int,
                    device: torch.device | str | None = None, batch_size: int | None = None) -> CTCTargets:
    """Validate targets (concatenated or padded ``(N, S)``, int32 or int64, labels in ``[1, A)``) and lengths and
    pack them for the kernels in one copy. A target too long for its input is allowed (an infinite loss)."""
    for name, value, low in (("num_classes (A)", num_classes, 2), ("max_time (T)", max_time, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    sizes = [len(v) for v in (input_lengths, target_lengths)  # N from the first length vector, unless given
             if isinstance(v, (list, tuple)) or (isinstance(v, (Tensor, np.ndarray)) and v.ndim == 1)]
    batch = batch_size if batch_size is not None else next(iter(sizes), None)
    if batch is None:
        raise TypeError("input_lengths and target_lengths must be 1-D integer tensors or sequences of ints")
    inputs, lengths = validate_lengths(input_lengths, target_lengths, batch=batch, max_time=max_time)
    lists = label_lists(targets, lengths, num_classes)
    device = torch.device(device) if device is not None else runtime.device()
    label_stride = max(1, int(lengths.max()) if batch else 1)
    slot_stride = max(1, max(len(np.unique(l)) + 1 for l in lists) if batch else 1)
    parts = pack(lists, inputs, lengths, label_stride, slot_stride)
    packed = torch.from_numpy(np.concatenate(parts)).to(device)
    return targets_view(packed, num_classes, max_time, inputs, lengths, lists, label_stride, slot_stride)


def pack(lists: Sequence[np.ndarray], inputs: np.ndarray, lengths: np.ndarray, label_stride: int,
         slot_stride: int) -> list[np.ndarray]:
    """The int32 arrays the kernels read, in the packed buffer's order: padded labels, input and target lengths,
    the slots (classes, starts, members) and their number; the strides are the buffer's capacity."""
    batch = len(lists)
    labels_pad = np.zeros((batch, label_stride), np.int32)
    slot_class = np.zeros((batch, slot_stride), np.int32)  # slot 0 = blank = class 0
    # slot u's members are slot_members[slot_start[u]:slot_start[u + 1]]; the blank (u = 0) lists none
    slot_start = np.zeros((batch, slot_stride + 1), np.int32)
    slot_members = np.zeros((batch, label_stride), np.int32)
    num_slots = np.zeros(batch, np.int32)
    for i, labels in enumerate(lists):
        classes, first = np.unique(labels, return_index=True)
        classes = classes[np.argsort(first, kind="stable")]  # slots in order of first occurrence
        if len(labels) > label_stride or len(classes) + 1 > slot_stride:
            raise ValueError(f"targets need more room than the buffer's {label_stride} labels and {slot_stride} "
                             "slots")
        members = [np.flatnonzero(labels == c) + 1 for c in classes]  # 1-based target positions
        labels_pad[i, :labels.size] = labels
        slot_class[i, 1:len(classes) + 1] = classes
        offsets = np.cumsum([0] + [m.size for m in members])
        slot_start[i, 1:len(offsets) + 1] = offsets
        slot_start[i, len(offsets) + 1:] = offsets[-1]
        if members:
            slot_members[i, :labels.size] = np.concatenate(members)
        num_slots[i] = len(classes) + 1
    return [labels_pad.ravel(), inputs.astype(np.int32), lengths.astype(np.int32), slot_class.ravel(),
            slot_start.ravel(), slot_members.ravel(), num_slots]


def packed_size(batch: int, label_stride: int, slot_stride: int) -> int:
    """int32 entries of the packed buffer (:func:`pack`)."""
    return batch * (2 * label_stride + 2 * slot_stride + 1) + 3 * batch


def targets_view(packed: Tensor, num_classes: int, max_time: int, inputs: np.ndarray, lengths: np.ndarray,
                 lists: Sequence[np.ndarray], label_stride: int, slot_stride: int) -> CTCTargets:
    """A :class:`CTCTargets` whose device arrays are views of ``packed`` (laid out by :func:`pack`)."""
    batch = len(lists)
    shapes = [(batch, label_stride), (batch,), (batch,), (batch, slot_stride), (batch, slot_stride + 1),
              (batch, label_stride), (batch,)]
    sizes = [int(np.prod(shape)) for shape in shapes]
    views = [part.view(shape) for part, shape in zip(packed[:sum(sizes)].split(sizes), shapes)]
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
