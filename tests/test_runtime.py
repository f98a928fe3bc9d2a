import os
import subprocess
import sys

import pytest
import torch

import studylog
from studylog import runtime


def test_mode_matches_the_machine():
    if torch.cuda.is_available():
        assert runtime.mode() in ("gpu", "interpreter")
    else:
        assert runtime.mode() == "interpreter"
        assert os.environ["TRITON_INTERPRET"] == "1"
        assert runtime.device().type == "cpu"
    assert runtime.mode() in studylog.describe().lower()


def test_import_alone_is_enough_for_kernels():
    """A fresh interpreter that only imports a kernel module can launch it: no manual env var."""
    code = (
        "import torch, studylog, book.env.tour as t;"
        "x = torch.randn(300, device=studylog.device());"
        "assert torch.equal(t.scale(x, 3.0), 3.0 * x); print(studylog.mode())"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("gpu" if torch.cuda.is_available() else "interpreter")


def test_require_gpu_message():
    if torch.cuda.is_available():
        runtime.require_gpu("this")
    else:
        with pytest.raises(RuntimeError, match="the ngram kernel needs a CUDA GPU"):
            runtime.require_gpu("the ngram kernel")
