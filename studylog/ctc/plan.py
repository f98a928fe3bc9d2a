"""A CTC loss call for one shape, built once and replayable in a CUDA graph: a graph bakes in the addresses and launch
shapes it captured, so a :class:`CTCPlan` fixes them for the largest batch it will see, in buffers allocated once."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from studylog import checks, runtime
from studylog.ctc import fused
from studylog.ctc.targets import (MAX_TARGET_LENGTH, CTCTargets, label_lists, pack, packed_size, targets_view,
                                  validate_lengths)


class CTCPlan:
    """Step ``step`` (7 to 14 at their default options; by default the one :func:`ctc_loss` runs for this shape)
    for activations of shape ``(max_time, batch_size, num_classes)`` and targets of at most ``max_target_length``
    labels. Per batch::

        plan.set_targets(targets, input_lengths, target_lengths)  # host: validate, pack, copy in
        activations.copy_(new_activations)                         # the buffer the graph captured
        graph.replay()                                             # or plan(activations), eagerly

    A call only launches the kernels into ``plan.loss`` and ``plan.grad``, at the plan's capacity.
    """

    def __init__(self, max_time: int, batch_size: int, num_classes: int, max_target_length: int, *,
                 step: int | None = None, zero_infinity: bool = False, device=None):
        for name, value, low in (("max_time", max_time, 1), ("batch_size", batch_size, 1),
                                 ("num_classes", num_classes, 2)):
            checks.check_int(name, value, low=low)
        checks.check_int("max_target_length", max_target_length, low=0, high=MAX_TARGET_LENGTH)
        positions = 2 * max(1, max_target_length) + 1  # the longest row of alpha the plan holds
        self.step = fused.final_step(max_time, batch_size, num_classes, positions) if step is None else step
        checks.check_int("step", self.step, low=7, high=14)  # the steps of one launcher, fused.launch
        self.shape = (max_time, batch_size, num_classes)
        self.zero_infinity = bool(zero_infinity)
        device = torch.device(device) if device is not None else runtime.device()
        # "cuda" means the current device; a tensor made there says which one, as the inputs' device will
        self.device = torch.empty(0, device=device).device
        self.label_stride = max(1, max_target_length)
        self.slot_stride = min(self.label_stride, num_classes - 1) + 1  # distinct labels, and the blank
        self._packed = torch.zeros(packed_size(batch_size, self.label_stride, self.slot_stride), dtype=torch.int32,
                                   device=self.device)
        pinned = self.device.type == "cuda"
        self._staging = [torch.empty(self._packed.shape, dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        self._copied = [None, None]  # the event after each staging buffer's last copy
        self._turn = 0
        T, N, A = self.shape
        self.loss = torch.empty((N,), dtype=torch.float32, device=self.device)
        self.grad = torch.empty(self.shape, dtype=torch.float32, device=self.device)
        nbytes = fused.scratch_bytes(self.step, T, N, A, self.label_stride)
        self.workspace = torch.empty((nbytes,), dtype=torch.uint8, device=self.device)
        empty = [np.zeros(0, np.int64)] * N
        self.targets: CTCTargets = self._write(empty, np.full(N, T, np.int64), np.zeros(N, np.int64))
        if self.device.type == "cuda":  # compile and load the kernels now, not during a capture
            self._launch(torch.zeros(self.shape, dtype=torch.float32, device=self.device))
            torch.cuda.synchronize(self.device)

    def _write(self, lists, inputs: np.ndarray, lengths: np.ndarray) -> CTCTargets:
        parts = np.concatenate(pack(lists, inputs, lengths, self.label_stride, self.slot_stride))
        turn = self._turn
        self._turn ^= 1
        staging = self._staging[turn]
        if self._copied[turn] is not None:  # its previous copy must have left before it is overwritten
            self._copied[turn].synchronize()
        staging.copy_(torch.from_numpy(parts))
        if self.device.type == "cuda":
            self._packed.copy_(staging, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._copied[turn] = event
        else:
            self._packed.copy_(staging)
        T, _, A = self.shape
        return targets_view(self._packed, A, T, inputs, lengths, lists, self.label_stride, self.slot_stride)

    def set_targets(self, targets: Tensor, input_lengths, target_lengths) -> CTCTargets:
        """Validate a batch's targets and lengths (as :func:`prepare_targets`) into the plan's buffers in stream
        order; host work, never inside a capture."""
        T, N, A = self.shape
        inputs, lengths = validate_lengths(input_lengths, target_lengths, batch=N, max_time=T)
        if lengths.size and int(lengths.max()) > self.label_stride:
            raise ValueError(f"target_lengths go up to {int(lengths.max())} but the plan holds at most "
                             f"{self.label_stride} labels")
        lists = label_lists(targets, lengths, A)
        self.targets = self._write(lists, inputs, lengths)
        return self.targets

    def _launch(self, activations: Tensor) -> None:
        fused.launch(activations, self.targets, self.loss, self.grad, self.zero_infinity, self.step,
                     scratch=self.workspace)

    def __call__(self, activations: Tensor) -> tuple[Tensor, Tensor]:
        """Loss and gradient of the targets last set, for ``activations`` of the plan's shape (graph-safe)."""
        if (not isinstance(activations, Tensor) or activations.shape != self.shape
                or activations.dtype != torch.float32 or not activations.is_contiguous()):
            raise ValueError(f"activations must be contiguous float32 of shape {self.shape} (the plan's); got "
                             f"{checks.describe(activations)}")
        if activations.device != self.device or self.device.type != "cuda":
            raise ValueError(f"activations must be on the plan's CUDA device ({self.device}), got {activations.device}")
        self._launch(activations)
        return self.loss, self.grad
