"""torch's two CTC paths as the benchmark runs them: which one a call takes, the calls, and whether a CUDA graph
can capture each. ``F.ctc_loss`` takes cuDNN's path only for int32 1-D targets **on the CPU** (and the length rules of
:func:`cudnn_eligible`); ``torch._cudnn_ctc_loss`` with int32 *device* targets takes our contract, graph-safe.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from studylog.ctc.targets import BLANK

#: cuDNN's CTC takes targets shorter than this (ATen's rule: ``target_lengths[b] < 256``).
CUDNN_TARGET_LIMIT = 256
#: torch's native forward kernel: a cuDNN call must not launch it.
NATIVE_MARKER = "ctc_loss_log_alpha"
#: The torch calls the benchmark times, by series: what each runs.
TORCH_SERIES = {
    "torch-cuDNN": "torch._cudnn_ctc_loss on the activations, int32 device targets and lengths (cudnnCTCLoss_v8)",
    "torch-cuDNN F.ctc_loss": "F.ctc_loss(log_softmax(x)) + autograd on its cuDNN path (int32 CPU targets, tuples)",
    "torch-native": "F.ctc_loss(log_softmax(x)) + autograd on its native kernels (int64 GPU targets, tuples)",
}


def cudnn_eligible(input_lengths: Sequence[int], target_lengths: Sequence[int], max_time: int) -> np.ndarray:
    """Per utterance: does it meet the length conditions of torch's cuDNN path (input length = T, fewer than
    256 labels, no more labels than frames)? A batch takes the path only if all do."""
    inputs, lengths = np.asarray(input_lengths, np.int64), np.asarray(target_lengths, np.int64)
    return (inputs == max_time) & (lengths < CUDNN_TARGET_LIMIT) & (lengths <= inputs)


def takes_cudnn_path(log_probs: Tensor, targets: Tensor, input_lengths, target_lengths, *, blank: int = BLANK,
                     cudnn_enabled: bool | None = None) -> bool:
    """A model of ATen's ``_use_cudnn_ctc_loss`` for ``F.ctc_loss`` that runs anywhere (the benchmark checks it)."""
    enabled = torch.backends.cudnn.enabled if cudnn_enabled is None else cudnn_enabled
    if not (enabled and blank == 0 and log_probs.device.type == "cuda" and log_probs.dtype == torch.float32
            and log_probs.ndim == 3 and targets.ndim == 1 and targets.dtype == torch.int32
            and targets.device.type == "cpu" and targets.is_contiguous()):
        return False
    return bool(cudnn_eligible(input_lengths, target_lengths, log_probs.shape[0]).all())


def concatenated(lists: Sequence[np.ndarray]) -> Tensor:
    """Label lists as one int32 1-D tensor (CPU)."""
    return torch.from_numpy(np.concatenate([np.asarray(labels, np.int32) for labels in lists]
                                           + [np.zeros(0, np.int32)]))


def padded(lists: Sequence[np.ndarray]) -> Tensor:
    """Label lists as an int64 (N, L_max) tensor padded with the blank (CPU)."""
    out = torch.zeros((len(lists), max([len(l) for l in lists] + [1])), dtype=torch.int64)
    for i, labels in enumerate(lists):
        out[i, :len(labels)] = torch.from_numpy(np.asarray(labels, np.int64))
    return out


def cudnn_direct(x: Tensor, lists: Sequence[np.ndarray]) -> Callable[[], tuple[Tensor, Tensor]]:
    """``torch._cudnn_ctc_loss`` on the activations ``x``, int32 device targets and lengths, every input length T."""
    T, N, _ = x.shape
    targets = concatenated(lists).to(x.device)
    inputs = torch.full((N,), T, dtype=torch.int32, device=x.device)
    lengths = torch.tensor([len(l) for l in lists], dtype=torch.int32, device=x.device)
    return lambda: torch._cudnn_ctc_loss(x, targets, inputs, lengths, BLANK, True, False)


def functional(x: Tensor, lists: Sequence[np.ndarray], path: str, *, reduction: str = "sum"
               ) -> Callable[[], tuple[Tensor, Tensor]]:
    """``F.ctc_loss(log_softmax(x))`` and autograd's gradient w.r.t. ``x`` on torch's ``"cudnn"`` path (int32 CPU
    targets) or ``"native"`` one (int64 GPU targets), lengths as tuples."""
    T, N, _ = x.shape
    targets = concatenated(lists) if path == "cudnn" else padded(lists).to(x.device)
    inputs, lengths = (T,) * N, tuple(len(l) for l in lists)

    def run():
        leaf = x.detach().requires_grad_(True)
        loss = torch.nn.functional.ctc_loss(leaf.log_softmax(2), targets, inputs, lengths, blank=BLANK,
                                            reduction=reduction)
        (grad,) = torch.autograd.grad(loss.sum(), leaf)
        return loss.detach(), grad
    return run


def device_work(fn: Callable[[], object], calls: int = 1) -> dict[str, float]:
    """Device time per call (µs, torch.profiler, no L2 flush) of every kernel or copy ``fn`` runs, by name (API
    calls such as cudaLaunchKernel left out)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type == DeviceType.CUDA and not re.match(r"cu(da)?[A-Z]", event.key):
            times[event.key] = times.get(event.key, 0.0) + event.device_time_total / calls
    return times


def kernel_names(fn: Callable[[], object]) -> list[str]:
    """Names of the CUDA kernels one call of ``fn`` launches (the profiler's), to tell the paths apart."""
    return sorted(device_work(fn))


#: Run by :func:`capturable` in a fresh process: each torch call warmed up, captured in a CUDA graph,
#: replayed, and its loss compared with an eager call's; prints one JSON line.
PROBE = r"""
import json, sys, torch
from studylog import runtime
from studylog.ctc import peers
T, N, A = 40, 3, 11
gen = torch.Generator().manual_seed(0)
x = torch.randn(T, N, A, generator=gen).cuda()
lists = [torch.randint(1, A, (n,), generator=gen).numpy() for n in (5, 9, 1)]
calls = {"torch-cuDNN": peers.cudnn_direct(x, lists), "torch-native": peers.functional(x, lists, "native"),
         "torch-cuDNN F.ctc_loss": peers.functional(x, lists, "cudnn")}
out = {}
for name, fn in calls.items():
    prev = torch.cuda.current_stream()
    try:
        eager = fn()[0].clone()
        graph, captured = runtime.cuda_graph(fn, warmups=1)
        graph.replay()
        torch.cuda.synchronize()
        same = bool(torch.allclose(captured[0], eager, rtol=1e-5, atol=1e-5))
        out[name] = [same, "" if same else "the replay's loss differs from an eager call's"]
    except Exception as exc:
        torch.cuda.set_stream(prev)
        out[name] = [False, (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]]
    try:
        torch.cuda.synchronize()
    except Exception as exc:
        out["_broken"] = [False, str(exc)[:300]]
        break
print(json.dumps(out))
"""


def capturable(timeout: float = 180.0) -> dict[str, tuple[bool, str]]:
    """For each series of :data:`TORCH_SERIES`: (captured and replayed correctly, why not), by :data:`PROBE` in a
    fresh process; a probe that fails as a whole marks every series not capturable."""
    try:
        from studylog.paths import REPO_ROOT

        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout,
                              cwd=REPO_ROOT, env=env)
    except Exception as exc:  # no answer: assume the worst, and say why
        reason = f"the capture probe did not finish ({type(exc).__name__}: {str(exc)[:200]})"
        return {name: (False, reason) for name in TORCH_SERIES}
    lines = done.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1])
    except (IndexError, ValueError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {name: (False, f"the capture probe gave no answer: {last}") for name in TORCH_SERIES}
    return {name: tuple(found.get(name, (False, "not probed"))) for name in TORCH_SERIES}
