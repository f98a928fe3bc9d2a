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
    pip = [sys.executable, "-m", "pip", "install", "--no-compile"]  # Python compiles what it imports
    override = os.environ.get("STUDYLOG_TORCH")
    have = installed_torch()
    if override:
        print(f"install_torch: taking {override}, as STUDYLOG_TORCH asks", flush=True)
        cmd = pip + [override]
    elif has_nvidia_gpu():
        if have and "+cpu" not in have:
            print(f"install_torch: nvidia-smi lists a GPU, and torch {have} (a CUDA build) is already installed")
            return 0
        print("install_torch: nvidia-smi lists a GPU, so taking PyTorch's CUDA build from PyPI (torch>=2.5, "
              "with its CUDA libraries: several GB)", flush=True)
        cmd = pip + ["torch>=2.5"]
    else:
        why = ("nvidia-smi is not on PATH" if shutil.which("nvidia-smi") is None
               else "nvidia-smi lists no GPU")
        if have and have.endswith("+cpu"):
            print(f"install_torch: {why}, and torch {have} (the CPU build) is already installed")
            return 0
        print(f"install_torch: {why}, so taking PyTorch's CPU build {CPU_SPEC} (no CUDA libraries; kernels will "
              "run in Triton's interpreter). On a GPU machine, check `nvidia-smi -L`, or set "
              "STUDYLOG_TORCH='torch>=2.5'", flush=True)
        cmd = pip + [CPU_SPEC]
        if reachable("download.pytorch.org"):
            cmd += ["--extra-index-url", CPU_INDEX]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
