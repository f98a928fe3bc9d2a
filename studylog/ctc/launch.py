"""What every step's launcher shares: the compiled kernels, a call's scratch memory and its checks."""

from __future__ import annotations

from itertools import accumulate
from typing import Sequence

import torch
from torch import Tensor

from studylog import checks, cuda
from studylog.ctc.targets import CTCTargets, prepare_targets

_KERNELS: dict[tuple[str, str], cuda.CudaKernel] = {}


def kernels(source: str, wanted: Sequence[tuple[str, Sequence[str]]]) -> list:
    """Kernels (name, signature) of one source in ``csrc``; the missing instances are compiled in one NVRTC call."""
    missing = [name for name, _ in wanted if (source, name) not in _KERNELS]
    if missing:
        module = cuda.load(source, name_expressions=tuple(name for name in missing if "<" in name))
        for name, signature in wanted:
            if (source, name) not in _KERNELS:
                _KERNELS[(source, name)] = module.kernel(name, signature)
    return [_KERNELS[(source, name)] for name, _ in wanted]


def _aligned(nbytes: Sequence[int]) -> list[int]:
    return [-(-size // 256) * 256 for size in nbytes]


def workspace_bytes(parts: Sequence[int]) -> int:
    """Bytes of one allocation holding segments of ``parts`` bytes, each 256-byte aligned."""
    return max(sum(_aligned(parts)), 1)


def workspace_addresses(device: torch.device, nbytes: Sequence[int], buffer: Tensor | None = None
                        ) -> tuple[Tensor, list[int]]:
    """The addresses of 256-byte aligned segments of ``nbytes`` (views would cost microseconds a call) in a new
    allocation or the caller's ``buffer``, which the caller keeps alive until the launches are queued."""
    total = workspace_bytes(nbytes)
    if buffer is None:
        buffer = torch.empty((total,), dtype=torch.uint8, device=device)
    elif buffer.dtype != torch.uint8 or buffer.device != device or not buffer.is_contiguous() or buffer.numel() < total:
        raise ValueError(f"workspace must be a contiguous uint8 tensor of at least {total} bytes on {device}")
    elif buffer.data_ptr() % 256:
        raise ValueError("workspace must be 256-byte aligned")
    return buffer, list(accumulate(_aligned(nbytes), initial=buffer.data_ptr()))[:len(nbytes)]


def output(out: Tensor | None, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """A caller's output buffer, checked, or a new one."""
    if out is None:
        return torch.empty(shape, dtype=torch.float32, device=like.device)
    return checks.check_out(name, out, shape=shape, dtype=torch.float32, device=like.device)


def prepare_call(activations, targets, input_lengths, target_lengths, out_loss, out_grad
                 ) -> tuple[CTCTargets, Tensor, Tensor]:
    """Every step's checks, before any launch: the prepared targets and the output buffers (checked, or new)."""
    if isinstance(targets, CTCTargets):
        if input_lengths is not None or target_lengths is not None:
            raise ValueError("pass either prepared targets or targets with their lengths, not both")
        batch = targets
    elif not isinstance(activations, Tensor) or activations.ndim != 3:
        raise ValueError("activations must be a (T, N, A) tensor")
    else:
        T, N, A = activations.shape
        batch = prepare_targets(targets, input_lengths, target_lengths, num_classes=A, max_time=T,
                                device=activations.device, batch_size=N)
    checks.check_tensor("activations", activations, dtype=torch.float32, ndim=3, contiguous=True)
    T, N, A = activations.shape
    if N != batch.batch:
        raise ValueError(f"activations hold N = {N} utterances but the targets {batch.batch}")
    if A != batch.num_classes:
        raise ValueError(f"activations have A = {A} classes but the targets were prepared for {batch.num_classes}")
    if max(batch.input_lengths_host, default=0) > T:
        raise ValueError(f"input_lengths go up to {max(batch.input_lengths_host)} but activations have T = {T}")
    loss = output(out_loss, "out_loss", (N,), activations)
    grad = output(out_grad, "out_grad", (T, N, A), activations)
    if grad.untyped_storage().data_ptr() == activations.untyped_storage().data_ptr():
        raise ValueError("out_grad must not share memory with activations (the kernels read them after "
                         "writing the gradient)")
    if activations.device.type != "cuda":
        raise ValueError(f"activations must be on a CUDA device, got {activations.device}")
    if batch.device != activations.device:
        raise ValueError(f"targets were prepared on {batch.device} but activations are on {activations.device}")
    return batch, loss, grad


def run_step(launch, activations, targets, input_lengths, target_lengths, out_loss, out_grad, *options
             ) -> tuple[Tensor, Tensor]:
    """A step's call: :func:`prepare_call`, then ``launch(activations, batch, loss, grad, *options)``."""
    batch, loss, grad = prepare_call(activations, targets, input_lengths, target_lengths, out_loss, out_grad)
    launch(activations, batch, loss, grad, *options)
    return loss, grad
