"""Where kernels run: on the GPU when torch sees one, else through Triton's interpreter.

Triton reads ``TRITON_INTERPRET`` when a kernel is *defined*, so ``studylog/__init__.py`` imports this module first.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

_HAS_GPU = torch.cuda.is_available()

if not _HAS_GPU:
    if os.environ.get("TRITON_INTERPRET", "1") != "1":
        warnings.warn("TRITON_INTERPRET is set to something other than 1 but no GPU is visible; studylog switches "
                      "Triton to its interpreter so kernels can still run on the CPU.", stacklevel=2)
    os.environ["TRITON_INTERPRET"] = "1"

#: ``"gpu"``, or ``"interpreter"``: Triton runs kernels on the CPU, one program at a time (slow; use small sizes).
MODE = "interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "gpu"


def mode() -> str:
    return MODE


def has_gpu() -> bool:
    """True when torch sees a CUDA device (CUDA C++ kernels can run)."""
    return _HAS_GPU


def device() -> torch.device:
    """The device to put kernel inputs on: ``cuda`` on a GPU machine, else ``cpu``."""
    return torch.device("cuda" if _HAS_GPU else "cpu")


@functools.lru_cache(maxsize=None)
def _device_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count() -> int:
    """The current GPU's SMs, for launch heuristics; an H100/H200's 132 on a CPU, so they choose as on that GPU."""
    return _device_sm_count(torch.cuda.current_device()) if _HAS_GPU else 132


def describe() -> str:
    """One line a reader can print to see how kernels will run."""
    if MODE == "gpu":
        props = torch.cuda.get_device_properties(0)
        return (f"GPU mode: {props.name} ({props.multi_processor_count} SMs, compute capability "
                f"{props.major}.{props.minor}); Triton kernels are compiled; CUDA C++ kernels are compiled with "
                "NVRTC and launched.")
    where = "on a GPU machine (TRITON_INTERPRET=1 was set)" if _HAS_GPU else "no GPU visible"
    return (f"Interpreter mode ({where}): Triton kernels run on the CPU through Triton's interpreter; "
            "CUDA C++ kernels can be compiled to PTX but not run. Timings here mean nothing.")


def reason() -> str:
    """Why kernels run in the mode they do: what torch sees, and the environment variables that matter."""
    if MODE == "gpu":
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees {torch.cuda.device_count()} GPU(s)"
    if _HAS_GPU:
        return "torch sees a GPU, but TRITON_INTERPRET=1 was set before studylog was imported"
    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU-only build (tools/install_torch.py takes it when nvidia-smi "
                "finds no GPU)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = f"; CUDA_VISIBLE_DEVICES={visible!r} hides devices" if visible is not None else ""
    return (f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no GPU "
            f"(no device, or no working driver{hidden})")


def require_gpu(what: str) -> None:
    """Raise a clear error when ``what`` needs a GPU and none is visible."""
    if not _HAS_GPU:
        raise RuntimeError(f"{what} needs a CUDA GPU, and torch sees none on this machine.")


def cuda_graph(fn, *, warmups: int = 2, pool=None):
    """``fn`` captured in a CUDA graph after ``warmups`` calls on a side stream: the graph and the call's result."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def staged(*shape: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed pinned host buffer and its device twin; on a CPU one tensor is both."""
    if device.type != "cuda":
        both = torch.zeros(shape, dtype=dtype, device=device)
        return both, both
    return torch.zeros(shape, dtype=dtype, pin_memory=True), torch.zeros(shape, dtype=dtype, device=device)
