"""Chapter 4's look at what NVRTC made of each step (:func:`compile_step`; on the CPU: NVRTC needs no GPU): PTX
loads, ptxas' registers and spills, and opcode counts of the SASS, as the lesson's tables show them."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from studylog import cuda
from studylog.ctc import fused, warpctc

#: Frames of emissions step 7's recursion loads ahead of the one it computes (the kernels' ``PREFETCH``).
PREFETCH_FRAMES = 4


def compile_step(step: int, *, grains: Sequence[int] = (), layouts: Sequence[bool] = (False,),
                 recursions: Sequence[str | None] = (None,), arch: str = cuda.DEFAULT_ARCH) -> cuda.CompiledSource:
    """NVRTC output of the ``.cu`` file of step ``step``'s own kernels at ``grains`` (steps 4 to 14), ``layouts``
    (4 to 6) and ``recursions`` (12 and 13)."""
    if step in (1, 2, 3):  # steps 2 and 3: both instances of the file's templates
        names = [n for s in ((2, 3) if step > 1 else (1,)) for n in warpctc.kernel_names(s) if "<" in n]
        return cuda.compile_source(warpctc.SOURCES[step], arch=arch, name_expressions=names)
    if step in (4, 5, 6):
        return cuda.compile_source(warpctc.SOURCES[step], arch=arch,
                                   name_expressions=warpctc.instance_names(step, grains, layouts))
    if step in range(7, 15):
        names = [fused.fused_kernel_names(step, v, option)[1] for v in grains
                 for option in (recursions if step in (12, 13) else (None,))]
        source = fused.source_of(fused.fused_kernel_names(step, 4)[2 if step == 13 else 1])
        return cuda.compile_source(source, arch=arch,
                                   name_expressions=[n for n in dict.fromkeys(names) if fused.source_of(n) == source])
    raise ValueError(f"step must be one of 1 to 14, got {step!r}")


def global_loads(ptx_function: str) -> dict[str, int]:
    """Global loads in one PTX function: coherent ``ld.global`` versus read-only ``ld.global.nc``."""
    nc = len(re.findall(r"^\s*(?:@%p\d+\s+)?ld\.global\.nc\b", ptx_function, flags=re.MULTILINE))
    every = len(re.findall(r"^\s*(?:@%p\d+\s+)?ld\.global\b", ptx_function, flags=re.MULTILINE))
    return {"ld.global": every - nc, "ld.global.nc": nc}


def load_table(compiled: cuda.CompiledSource, kernels: Sequence[str]) -> list[dict[str, object]]:
    """For each kernel: its loads (coherent / non-coherent) and ptxas' registers and spills."""
    report = compiled.ptxas_report()
    rows = []
    for name in kernels:
        mangled = compiled.lowered_names.get(name, name)
        loads = global_loads(compiled.ptx_function(name))
        rows.append({"kernel": name, **loads, **report.get(mangled, {})})
    return rows


def nvdisasm_path() -> Path | None:
    """``nvdisasm`` from a CUDA toolkit on the PATH, or the copy Triton's wheel bundles; None if neither."""
    found = shutil.which("nvdisasm")
    if found:
        return Path(found)
    try:
        import triton
    except ImportError:  # pragma: no cover - triton is a dependency
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    return bundled if bundled.is_file() else None


def sass(compiled: cuda.CompiledSource) -> dict[str, list[str]]:
    """The SASS (machine code) of every kernel of a cubin, as opcode lines per mangled kernel name.

    Needs ``nvdisasm`` (see :func:`nvdisasm_path`); raises ``FileNotFoundError`` without it.
    """
    tool = nvdisasm_path()
    if tool is None:
        raise FileNotFoundError("nvdisasm not found (neither on the PATH nor in Triton's wheel)")
    if compiled.cubin is None:
        raise ValueError("SASS needs a cubin: compile for an sm_XX target")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(compiled.cubin)
        handle.flush()
        text = subprocess.run([str(tool), "-c", handle.name], check=True, capture_output=True, text=True).stdout
    kernels: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^\s*\.text\.(\S+):\s*$", line)
        if m:
            current = kernels.setdefault(m.group(1), [])
            continue
        m = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if m and current is not None:
            current.append(re.sub(r"^@!?U?P[T0-9]+\s+", "", m.group(1)))  # drop the predicate
    return kernels


def sass_counts(compiled: cuda.CompiledSource, kernels: Sequence[str]) -> list[dict[str, object]]:
    """Per kernel: SASS instructions, divergent regions (``BSSY``, one per branch the warp may split
    at), transcendental ops (``MUFU``: ex2, lg2), shuffles (``SHFL``) and warp reductions (``REDUX``)."""
    code = sass(compiled)
    rows = []
    for name in kernels:
        ops = code[compiled.lowered_names.get(name, name)]
        first = [op.split()[0] for op in ops]
        rows.append({"kernel": name, "instructions": len(ops),
                     "BSSY": sum(f == "BSSY" for f in first),
                     "MUFU": sum(f.startswith("MUFU") for f in first),
                     "SHFL": sum(f.startswith("SHFL") for f in first),
                     "REDUX": sum(f.startswith("REDUX") for f in first)})
    return rows


#: Column headers a reader reads for the rows' keys (PTX opcodes and SASS opcodes are shown as code).
HEADERS = {"ld.global": "`ld.global`", "ld.global.nc": "`ld.global.nc`", "stack_bytes": "stack (bytes)",
           "spill_stores": "spill stores", "spill_loads": "spill loads"}


def markdown(rows: Sequence[dict[str, object]]) -> str:
    """A list of same-keyed dicts as a Markdown table, its headers in words (:data:`HEADERS`)."""
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(HEADERS.get(k, k) for k in keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(f"`{r[k]}`" if k == "kernel" else str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


__all__ = ["compile_step", "global_loads", "load_table", "markdown", "nvdisasm_path", "sass", "sass_counts"]
