"""A CTC loss call for one shape, built once and replayable in a CUDA graph: a graph bakes in the addresses and launch
shapes it captured, so a :class:`CTCPlan` fixes them for the largest batch it will see, in buffers allocated once."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from studylog import checks, runtime
from studylog.ctc import fused, warpctc
from studylog.ctc.targets import (MAX_TARGET_LENGTH, CTCTargets, label_lists, pack, packed_size, targets_view,
                                  validate_lengths)


class CTCPlan:
    """Step ``step`` (by default the one :func:`ctc_loss` runs for this shape) for activations of shape
    ``(max_time, batch_size, num_classes)`` and targets of at most ``max_target_length`` labels. Per batch::

        plan.set_targets(targets, input_lengths, target_lengths)  # host: validate, pack, copy in
        activations.copy_(new_activations)                         # the buffer the graph captured
        graph.replay()                                             # or plan(activations), eagerly

    A call only launches the kernels into ``plan.loss`` and ``plan.grad`` (step 6: ``plan.estimate``, see
    :meth:`untrusted`), at the plan's capacity. ``how``: the step's options, fixed for the plan.
    """

    def __init__(self, max_time: int, batch_size: int, num_classes: int, max_target_length: int, *,
                 step: int | None = None, zero_infinity: bool = False, device=None, **how):
        from studylog.ctc import CHAPTER

        for name, value, low in (("max_time", max_time, 1), ("batch_size", batch_size, 1),
                                 ("num_classes", num_classes, 2)):
            checks.check_int(name, value, low=low)
        checks.check_int("max_target_length", max_target_length, low=0, high=MAX_TARGET_LENGTH)
        self.step = fused.final_step(max_time, batch_size, num_classes) if step is None else step
        CHAPTER.step(self.step)  # a step of the chapter
        self.shape = (max_time, batch_size, num_classes)
        self.zero_infinity = bool(zero_infinity)
        self.how = dict(how)
        self._check_options()
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
        self.estimate = torch.empty((N,), dtype=torch.float32, device=self.device) if self.step == 6 else None
        if self.estimate is not None:
            # which targets the loss and estimate are of: set_targets bumps _set_gen, each call (and so each replay
            # of a graph that captured one) copies it into _call_gen; untrusted compares them
            self._gen = 0
            self._set_gen = torch.zeros(1, dtype=torch.int32, device=self.device)
            self._call_gen = torch.full((1,), -1, dtype=torch.int32, device=self.device)
        nbytes = (warpctc.scratch_bytes(T, N, A, 2 * self.label_stride + 1) if self.step <= 6 else
                  fused.scratch_bytes(self.step, T, N, A, self.label_stride, how.get("grain")))  # step 14's grain
        self.workspace = torch.empty((nbytes,), dtype=torch.uint8, device=self.device)
        empty = [np.zeros(0, np.int64)] * N
        self.targets: CTCTargets = self._write(empty, np.full(N, T, np.int64), np.zeros(N, np.int64))
        if self.device.type == "cuda":  # compile and load the kernels now, not during a capture
            self._launch(torch.zeros(self.shape, dtype=torch.float32, device=self.device))
            torch.cuda.synchronize(self.device)

    def _check_options(self) -> None:
        allowed = {**{k: ("grain", "blocked") for k in (4, 5, 6)}, 12: ("recursion",), 13: ("recursion",),
                   14: ("grain",)}.get(self.step, ())
        unknown = sorted(set(self.how) - set(allowed))
        if unknown:
            raise TypeError(f"step {self.step} takes no option {unknown} (it takes {list(allowed) or 'none'})")
        if self.step in (4, 5, 6):
            warpctc.check_grain(self.how.get("grain"))
        if self.step in (12, 13):
            fused.check_recursion(self.how.get("recursion"))
        if self.step == 14 and self.how.get("grain") not in (None, *fused.BLOCK_GRAINS):
            raise ValueError(f"grain must be one of {fused.BLOCK_GRAINS} for step 14, got {self.how['grain']!r}")

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
        if self.estimate is not None:
            self._gen += 1
            self._set_gen.fill_(self._gen)
        return self.targets

    def _launch(self, activations: Tensor) -> None:
        if self.step <= 6:
            warpctc.launch(activations, self.targets, self.loss, self.grad, self.step, self.zero_infinity,
                            self.how.get("grain"), self.how.get("blocked", False), self.estimate, self.workspace)
            if self.estimate is not None:
                self._call_gen.copy_(self._set_gen)
        else:
            fused.launch(activations, self.targets, self.loss, self.grad, self.zero_infinity, self.step,
                          self.how.get("recursion"), self.how.get("grain"), self.workspace)

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

    def untrusted(self) -> Tensor:
        """Step 6 only: :func:`untrusted_answers` after the call or replay; waits for the GPU."""
        if self.estimate is None:
            raise ValueError("only a step 6 plan estimates underflow")
        if int(self._call_gen) != int(self._set_gen):
            raise ValueError("the plan has not been called (or its graph replayed) since its targets were last set: "
                             "its loss and estimate are not of those targets. Call the plan first")
        return warpctc.untrusted_answers(self.loss, self.estimate, self.targets)
