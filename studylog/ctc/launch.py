"""What every step's launcher shares: the compiled kernels (one NVRTC call per source and set of
template instances), the scratch memory of a call, and the checks a call makes before any launch."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from studylog import cuda
from studylog.ctc.targets import CTCTargets, batch_of, check_activations, check_device, output

_KERNELS: dict[tuple[str, str], cuda.CudaKernel] = {}


def kernels(source: str, wanted: Sequence[tuple[str, Sequence[str]]]) -> list:
    """Kernels (name, signature) of one source (a file stem in ``studylog/ctc/csrc``); the missing
    template instances are compiled in one NVRTC call."""
    missing = [name for name, _ in wanted if (source, name) not in _KERNELS]
    if missing:
        module = cuda.load(source, name_expressions=tuple(name for name in missing if "<" in name))
        for name, signature in wanted:
            if (source, name) not in _KERNELS:
                _KERNELS[(source, name)] = module.kernel(name, signature)
    return [_KERNELS[(source, name)] for name, _ in wanted]


def workspace(device: torch.device, parts: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> list[Tensor]:
    """Scratch tensors carved out of one allocation (one call to the allocator instead of several)."""
    offsets, total = [], 0
    for shape, dtype in parts:
        offsets.append(total)
        total += -(-math.prod(shape) * dtype.itemsize // 256) * 256  # 256-byte aligned segments
    buffer = torch.empty((max(total, 1),), dtype=torch.uint8, device=device)
    return [buffer[o:o + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
            for o, (shape, dtype) in zip(offsets, parts)]


def workspace_addresses(device: torch.device, nbytes: Sequence[int]) -> tuple[Tensor, list[int]]:
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


def prepare_call(activations, targets, input_lengths, target_lengths, out_loss, out_grad
                 ) -> tuple[CTCTargets, Tensor, Tensor]:
    """Every step's checks, before any launch: the prepared targets and the (checked) output buffers."""
    batch = batch_of(activations, targets, input_lengths, target_lengths)
    check_activations(activations, batch)
    T, N, A = activations.shape
    loss = output(out_loss, "out_loss", (N,), activations)
    grad = output(out_grad, "out_grad", (T, N, A), activations)
    if grad.untyped_storage().data_ptr() == activations.untyped_storage().data_ptr():
        raise ValueError("out_grad must not share memory with activations (the kernels read them after "
                         "writing the gradient)")
    check_device(activations, batch)
    return batch, loss, grad
