"""Chapter 5: ternary (-1/0/+1) matmul, ``z = x @ W.T / scale`` (W an ``nn.Linear`` weight, (N, K); x (M, K) or
(K,); z float32), in Triton (steps 1 to 14) then CUDA C++ (steps 15 to 25). ``CHAPTER.steps`` lists the steps,
each with its function ``stepNN_<slug>`` and benchmark series ``stepNN``."""

from __future__ import annotations

import importlib
from typing import Any

from studylog.chapter import Chapter
from studylog.ternary import ops, peers  # ops: the entry point as a torch.library operator (torch.ops.studylog)
from studylog.ternary.report import bench
from studylog.ternary.results import BASELINES, headline
from studylog.ternary.steps import STEPS, ternary_matmul

CHAPTER = Chapter(
    name="ternary",
    number=5,
    title="Ternary matmul: Triton, then CUDA C++ with MMA, TMA and int8 activations",
    notebooks=("05_ternary_1_triton", "05_ternary_2_cuda"),
    steps=STEPS,
    bench=bench,
    headline=headline,
    baselines=BASELINES,
)

#: The modules whose public names are also the package's (``T.step05_gemv``, ``T.pack_2bit``, ``T.SERIES``).
MODULES = ("formats", "steps", "triton_steps", "triton_mma", "cuda_steps", "w2a8", "results", "report")


def __getattr__(name: str) -> Any:
    for module in MODULES:
        found = importlib.import_module(f"{__name__}.{module}").__dict__
        if name in found and not name.startswith("_"):
            return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: What a reader imports after the two lessons. The configs, launches, benchmark and results stay reachable as
#: attributes of the package or by their module.
__all__ = [
    "CHAPTER", "ternary_matmul", "ops", *(step.name for step in STEPS),
    # the weights' formats, BitNet's quantisation, the reference
    "PackedTernary", "quantize_absmean", "quantize_activations", "reference", "error_ratio", "FP32_TOLERANCE",
    # the W2A8 steps' choice of place and config, their grid, and step 23 made once for a layer (eager loops)
    "w2a8_choose", "w2a8_grid", "W2A8Plan",
    "peers",  # GemLite, torch._int_mm (imported lazily)
]
