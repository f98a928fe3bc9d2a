"""Chapter 5's closest peer: BitNet's own W2A8 GPU kernel (microsoft/BitNet ``gpu/bitnet_kernels``), built from a
checkout (:data:`BITNET_ENV`) with nvcc and called through ctypes as its ``gpu/test.py`` does: for one row of int8
x, bf16 ``out[n] = (sum_k xq[k] w[n, k]) / s * ws[...]`` at the (N, K) of :data:`BITNET_SHAPES`."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from jaxtyping import Int8
from torch import Tensor

from studylog.checks import check_tensor
from studylog.ternary.formats import check_ternary_values

#: The variable that holds the path of a checkout of microsoft/BitNet (its folder, or its ``gpu`` folder).
BITNET_ENV = "STUDYLOG_BITNET"
#: The (N, K) that ``bitlinear_int8xint2`` launches a kernel for, all at M = 1 (``gpu/bitnet_kernels.cu``).
BITNET_SHAPES = ((3840, 2560), (2560, 2560), (13824, 2560), (2560, 6912), (4800, 3200), (3200, 3200),
                 (20480, 3200), (3200, 10240), (5120, 27648), (55296, 5120))
#: How many weight scales its kernel can index (its largest ``ws_num``).
BITNET_WEIGHT_SCALES = 6
KERNEL_FILE = Path("gpu") / "bitnet_kernels" / "bitnet_kernels.cu"


def bitnet_checkout() -> Optional[Path]:
    """The checkout that holds :data:`KERNEL_FILE`, from :data:`BITNET_ENV`; None where none is given."""
    path = os.environ.get(BITNET_ENV)
    if not path:
        return None
    root = Path(path).expanduser().resolve()
    for candidate in (root, root.parent):
        if (candidate / KERNEL_FILE).is_file():
            return candidate
    raise FileNotFoundError(f"{BITNET_ENV}={path!r}: no {KERNEL_FILE} under it (a checkout of microsoft/BitNet, "
                            "or its gpu folder, is expected)")


@functools.lru_cache(maxsize=None)
def bitnet_library(root: Path) -> ctypes.CDLL:
    """Build BitNet's kernel file with nvcc for this GPU (cached by the file's hash and the target) and load it."""
    source = root / KERNEL_FILE
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    digest = hashlib.sha256(source.read_bytes() + (source.parent / "bitnet_kernels.h").read_bytes()).hexdigest()
    out = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "studylog" / "bitnet"
    out.mkdir(parents=True, exist_ok=True)
    lib = out / f"libbitnet_{digest[:16]}_sm{arch}.so"
    if not lib.exists():
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        # BitNet's compile.sh, with this GPU's target instead of compute_80 PTX
        cmd = [nvcc, "-std=c++17", "-O3", "-Xcudafe", "--diag_suppress=177", "--compiler-options", "-fPIC",
               "-lineinfo", "--shared", str(source), "-lcuda", f"-gencode=arch=compute_{arch},code=sm_{arch}",
               "-o", str(lib)]
        subprocess.run(cmd, check=True, cwd=source.parent, capture_output=True, text=True)
    library = ctypes.CDLL(str(lib))
    library.bitlinear_int8xint2.restype = None
    return library


def _shared_load_layout() -> np.ndarray:
    """BitNet's ``B_global_16x32_to_shared_load_16x32_layout``: the (row, column) each stored (i, j) of a tile holds."""
    mapping = np.zeros((16, 32, 2), dtype=np.int64)
    for i in range(16):
        for j in range(32):
            thread = i * 2 + j // 16
            mapping[i, j] = ((thread // 16) * 8 + thread % 8, j % 16 + 16 * ((thread % 16) // 8))
    return mapping


def bitnet_pack(w: Int8[Tensor, "n k"]) -> Int8[Tensor, "n k4"]:
    """Ternary weights (N, K) in BitNet's layout (its ``convert_weight_int8_to_int2``): codes ``w + 2``, 16 x 32
    tiles permuted for its loads, a word's 16 codes interleaved so one shift and mask yields four int8."""
    check_tensor("w", w, dtype=torch.int8, ndim=2)
    n, k = w.shape
    if n % 16 or k % 32:
        raise ValueError(f"w must have N a multiple of 16 and K of 32 for BitNet's layout, got {n} x {k}")
    check_ternary_values("w", w)
    codes = w.to(torch.int32) + 2
    mapping = torch.from_numpy(_shared_load_layout()).to(w.device)
    tiles = codes.view(n // 16, 16, k // 32, 32).permute(0, 2, 1, 3)  # [N/16, K/32, 16, 32]
    flat = tiles.reshape(n // 16, k // 32, 16 * 32)
    permuted = flat[:, :, mapping[..., 0] * 32 + mapping[..., 1]]  # [N/16, K/32, 16, 32]
    # 16 codes a 32-bit word, code o in bits (o % 4) * 8 + (o // 4) * 2; the words' bytes little-endian
    shifts = torch.tensor([(o % 4) * 8 + (o // 4) * 2 for o in range(16)], device=w.device)
    words = (permuted.reshape(n // 16, k // 32, 32, 16).to(torch.int64) << shifts).sum(dim=-1)  # disjoint: an OR
    out = torch.stack([(words >> (8 * b)) & 0xFF for b in range(4)], dim=-1)
    return out.to(torch.uint8).view(torch.int8).reshape(n, k // 4)


def bitnet_scales(x_scale: Tensor, scale: float, device) -> tuple[Tensor, Tensor]:
    """The bf16 scales BitNet's kernel takes: ``s`` (x's, one row) and ``ws`` (``1 / scale`` in each slot)."""
    s = x_scale.reshape(-1)[:1].to(device=device, dtype=torch.bfloat16)
    ws = torch.full((BITNET_WEIGHT_SCALES,), 1.0 / scale, dtype=torch.bfloat16, device=device)
    return s, ws


def bitnet_linear(library: ctypes.CDLL, xq: Tensor, packed: Tensor, s: Tensor, ws: Tensor, out: Tensor) -> Tensor:
    """One call of BitNet's ``bitlinear_int8xint2`` on the current stream: bf16 ``out`` (1, N) from int8 ``xq``."""
    n, k = packed.shape[0], packed.shape[1] * 4
    if xq.shape != (1, k) or (n, k) not in BITNET_SHAPES:
        raise ValueError(f"BitNet's kernel takes one row of x at (N, K) in {BITNET_SHAPES}; got x {tuple(xq.shape)} "
                         f"and weights {n} x {k}")
    stream = torch.cuda.current_stream().cuda_stream
    library.bitlinear_int8xint2(ctypes.c_void_p(xq.data_ptr()), ctypes.c_void_p(packed.data_ptr()),
                                ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(s.data_ptr()),
                                ctypes.c_void_p(ws.data_ptr()), ctypes.c_int(1), ctypes.c_int(n), ctypes.c_int(k),
                                ctypes.c_void_p(stream))
    return out
