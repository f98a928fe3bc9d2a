"""Step 1, the CPU path: the serving engine's serial loop as C (``csrc/ngram_cpu_path.c``), compiled at first use
and called through ``ctypes``; :class:`CpuPathCall` adds the deployed path's device<->host copies."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from torch import Tensor

from studylog.ngram.formats import NgramConfig, NgramInputs, validate
from studylog.paths import cache_dir, chapter_csrc

CPU_SOURCE = chapter_csrc("ngram") / "ngram_cpu_path.c"


def _cache_dir() -> Path:
    """:func:`~studylog.paths.cache_dir`, or the temporary folder where that is read-only."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    except OSError:
        return Path(tempfile.gettempdir())


@functools.lru_cache(maxsize=None)
def cpu_library() -> ctypes.CDLL:
    """The CPU path as a shared library, compiled with the system C compiler once per source."""
    text = CPU_SOURCE.read_bytes()
    target = _cache_dir() / f"ngram_cpu_path_{hashlib.sha256(text).hexdigest()[:16]}.so"
    if not target.exists():
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            raise RuntimeError("the CPU path (step 1) needs a C compiler (cc, gcc or clang), and none is on PATH")
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        out = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(CPU_SOURCE)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"compiling {CPU_SOURCE.name} failed:\n{out.stderr}")
        os.replace(tmp, target)  # atomic: parallel test workers never load a half-written file
    lib = ctypes.CDLL(str(target))
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ngram_match_cpu.argtypes = [p, p, i64, p, p, i64, p, p, p, p, p, p, i64, i64, i32, i32, i64, i32, i32]
    lib.ngram_match_cpu.restype = i64
    return lib


def cpu_path_inplace(inputs: NgramInputs, draft_tokens: Tensor, seq_lens_this_time: Tensor, config: NgramConfig, *,
                     checked: bool = False) -> int:
    """Run the C loop on CPU tensors, in place; returns the windows it compared. Validated first, values included
    (the loop trusts every length and dtype it is given), unless ``checked`` (a matcher checked them when built)."""
    if not checked:
        validate(inputs, draft_tokens, seq_lens_this_time, config, check_values=True)
    if inputs.prompt_ids.device.type != "cpu":  # validate put every tensor on prompt_ids' device
        raise ValueError("the C loop takes CPU tensors; step01_cpu_path does the copies")
    i, c = inputs, config
    return int(cpu_library().ngram_match_cpu(
        i.prompt_ids.data_ptr(), i.prompt_lens.data_ptr(), i.prompt_ids.shape[1], i.generated_ids.data_ptr(),
        i.step_idx.data_ptr(), i.generated_ids.shape[1], i.draft_token_num.data_ptr(), i.max_dec_len.data_ptr(),
        i.seq_lens_encoder.data_ptr(), i.seq_lens_decoder.data_ptr(), seq_lens_this_time.data_ptr(),
        draft_tokens.data_ptr(), draft_tokens.shape[1], i.batch, c.max_ngram_size, c.min_ngram_size, c.threshold,
        int(c.hybrid), c.max_draft_tokens))


class CpuPathCall:
    """The CPU path bound to one batch, as deployed: the prompt is copied to the host once (again when its tensors
    are rebound or written; :meth:`refresh` after a write torch does not see); each call copies the generated tokens,
    lengths and draft buffers there, runs the C loop and copies the drafts back (on CPU tensors: only the loop)."""

    def __init__(self, inputs: NgramInputs, draft_tokens: Tensor, seq_lens_this_time: Tensor, config: NgramConfig):
        self.inputs, self.draft_tokens, self.seq_lens_this_time, self.config = (
            inputs, draft_tokens, seq_lens_this_time, config)
        self.refresh()

    def refresh(self) -> None:
        """Copy the prompt (ids and lengths) to the host: a new request's admission."""
        p, lens = self.inputs.prompt_ids, self.inputs.prompt_lens
        self._copied = (p, lens, (p._version, lens._version))  # the tensors themselves: ids may be reused
        self.host_prompt, self.host_prompt_lens = p.cpu(), lens.cpu()

    def __call__(self) -> None:
        i, draft, this_time = self.inputs, self.draft_tokens, self.seq_lens_this_time
        if i.prompt_ids.device.type == "cpu":
            cpu_path_inplace(i, draft, this_time, self.config, checked=True)
            return
        p, lens, versions = self._copied
        if i.prompt_ids is not p or i.prompt_lens is not lens or (p._version, lens._version) != versions:
            self.refresh()  # new prompts were admitted into the buffers
        # Each .cpu() waits for the GPU: the copies are where the deployed path lost its time.
        host = NgramInputs(self.host_prompt, self.host_prompt_lens, i.generated_ids.cpu(), i.step_idx.cpu(),
                           i.draft_token_num.cpu(), i.max_dec_len.cpu(), i.seq_lens_encoder.cpu(),
                           i.seq_lens_decoder.cpu())
        host_draft, host_this_time = draft.cpu(), this_time.cpu()
        cpu_path_inplace(host, host_draft, host_this_time, self.config, checked=True)
        draft.copy_(host_draft)
        this_time.copy_(host_this_time)
