"""What NVRTC makes of each step's own ``.cu`` file (on the CPU: NVRTC needs no GPU)."""

from __future__ import annotations

from typing import Sequence

from studylog import cuda
from studylog.ctc import fused, warpctc


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
