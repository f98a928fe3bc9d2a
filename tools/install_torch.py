"""Install PyTorch into the current environment, the right build for this machine.

* With an NVIDIA GPU (``nvidia-smi -L`` lists one): the normal wheel from PyPI, which brings CUDA.
* Without one: the CPU build ``torch==2.13.0+cpu``. The ``+cpu`` local version exists only as a
  CPU wheel, so this can never pull several GB of CUDA libraries by accident. pip finds it in its
  configured links, or on download.pytorch.org when that host is reachable.
* ``STUDYLOG_TORCH="torch==X"`` overrides both.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

CPU_SPEC = "torch==2.13.0+cpu"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def reachable(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def installed_torch() -> str | None:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def main() -> int:
    pip = [sys.executable, "-m", "pip", "install"]
    override = os.environ.get("STUDYLOG_TORCH")
    have = installed_torch()
    if override:
        cmd = pip + [override]
    elif has_nvidia_gpu():
        if have and "+cpu" not in have:
            print(f"torch {have} already installed")
            return 0
        cmd = pip + ["torch>=2.5"]
    else:
        if have and have.endswith("+cpu"):
            print(f"torch {have} (CPU build) already installed")
            return 0
        cmd = pip + [CPU_SPEC]
        if reachable("download.pytorch.org"):
            cmd += ["--extra-index-url", CPU_INDEX]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
