"""Chapter 4: CTC loss and its gradient with respect to the activations, in CUDA C++.

Activations ``(T, N, A)``, one target per utterance, input and target lengths, blank = 0; out come ``loss[N]`` and
the gradient of ``loss.sum()`` (softmax included). Steps 1 to 6 (``warpctc``) follow warp-ctc's design, step 6 being
the probability-space counterexample; steps 7 to 14 (``fused``) make the gradient a pass of its own and move the
recursion onto warps. :func:`ctc_loss` runs step 12, 13 or 14, as ``fused.final_step`` picks. Every log-space
step renormalises its rows by their maximum every frame: plain float32 log space loses the whole error budget at
T = 150.
"""

from __future__ import annotations

from studylog import runtime  # noqa: F401  (runtime: GPU or interpreter is chosen first)
from studylog.chapter import Chapter, Step
from studylog.paths import chapter_csrc
from studylog.ctc import report, results
from studylog.ctc.fused import (ctc_loss, recursion_name, step07_gradient_pass, step08_fused_softmax, step09_one_warp,
                                step10_side_by_side, step11_branch_free, step12_flush_to_zero, step13_two_passes,
                                step14_warps_per_direction, warp_grain)
from studylog.ctc.peers import padded, takes_cudnn_path
from studylog.ctc.plan import CTCPlan
from studylog.ctc.reference import FAR_GRAD, FAR_LOSS, GRAD_TOLERANCE, LOSS_TOLERANCE, errors, reference_ctc
from studylog.ctc.report import BENCH_A, BENCH_N, BENCH_T, random_targets, stress_inputs
from studylog.ctc.targets import BLANK, MAX_TARGET_LENGTH, CTCTargets, min_frames, prepare_targets
from studylog.ctc.warpctc import (GRAIN_SIZES, UnderflowWarning, kernel_names, step01_baseline, step02_restrict,
                                  step03_ldg, step04_register_blocking, step05_shared_rows, step06_probability_space)
from studylog.ctc import ops  # the entry point as a torch.library operator (torch.ops.studylog)


#: What each step changes (the chapter's table of steps), by its function ``stepNN_<slug>``.
_TITLES = {
    step01_baseline: "warp-ctc's design: alpha matrix in global memory, gradient in the beta kernel",
    step02_restrict: "every pointer __restrict__",
    step03_ldg: "read-only loads through __ldg",
    step04_register_blocking: "a thread's positions, labels and skips in registers (grain size)",
    step05_shared_rows: "the alpha kernel's two live rows in shared memory",
    step06_probability_space: "probabilities rescaled every frame instead of logs (the counterexample)",
    step07_gradient_pass: "the gradient a pass of its own, a block per frame, after alpha and beta",
    step08_fused_softmax: "no softmax written: the first pass keeps each frame's log-sum-exp and the target's emissions",
    step09_one_warp: "one warp per direction: positions in registers, neighbours by shuffles, no barrier",
    step10_side_by_side: "alpha's warp and beta's side by side",
    step11_branch_free: "the warp recursion without its divergent branch",
    step12_flush_to_zero: "flush-to-zero ex2/lg2 in the recursion",
    step13_two_passes: "softmax written by the first pass, target's classes corrected in place",
    step14_warps_per_direction: "the recursion over several warps per direction",
}
#: Each step's source file (in ``csrc``) and the kernel (or device function) of it that the lesson shows.
_SHOWN = {
    1: ("ctc_step01_baseline.cu", "ctc_alpha_step1"), 2: ("ctc_step02_03_restrict_ldg.cu", "ctc_alpha_restrict"),
    3: ("ctc_step02_03_restrict_ldg.cu", "ctc_beta_grad_restrict"), 4: ("ctc_step04_05_blocked.cu", "ctc_alpha_step4"),
    5: ("ctc_step04_05_blocked.cu", "ctc_alpha_step5"), 6: ("ctc_step06_probability.cu", "ctc_alpha_step6"),
    7: ("ctc_step07_10_three_passes.cu", "ctc_grad_from_log_softmax"),
    8: ("ctc_step07_10_three_passes.cu", "ctc_fused_grad"),
    9: ("ctc_warp_recursion.cuh", "warp_recursion_direction"),
    10: ("ctc_step07_10_three_passes.cu", "ctc_fused_recursion"),
    11: ("ctc_step11_12_branch_free.cu", "FrameUpdate"), 12: ("ctc_branch_free.cuh", "pow2"),
    13: ("ctc_step13_two_passes.cu", "ctc_target_grad"), 14: ("ctc_step14_warps.cu", "ctc_warps_direction"),
}


def _step(function, title: str) -> Step:
    """The step of ``function`` (``stepNN_<slug>``: its number and slug) with its title and shown kernel."""
    number, slug = function.__name__.removeprefix("step").split("_", 1)
    source, kernel = _SHOWN[int(number)]
    return Step(int(number), slug, title, "cuda", function, chapter_csrc("ctc") / source, kernel)


CHAPTER = Chapter(
    name="ctc", number=4, notebooks=("04_ctc_loss",),
    title="CTC loss in CUDA C++",
    steps=tuple(_step(function, title) for function, title in _TITLES.items()),
    bench=report.bench,
    headline=results.headline,
    baselines={
        "torch-cuDNN": "cuDNN's CTC through torch._cudnn_ctc_loss on the activations (int32 device targets and "
                       "lengths; in lab/ctc's options run, F.ctc_loss on its cuDNN path)",
        "torch-cuDNN F.ctc_loss": "torch.nn.functional.ctc_loss on its cuDNN path (int32 CPU targets), autograd",
        "torch-native": "torch.nn.functional.ctc_loss on its native CUDA kernels (int64 GPU targets), autograd",
        "torch-best": "the faster of torch's calls timed on the GPU clock at each point",
        "torch-best span": "the faster of torch's calls on the kernel clock at each point",
    },
)

#: What a reader imports after the chapter; the benchmark's and the book's names above stay reachable too.
__all__ = [
    "CHAPTER", "ops", "ctc_loss", "CTCPlan",
    "step01_baseline", "step02_restrict", "step03_ldg", "step04_register_blocking", "step05_shared_rows",
    "step06_probability_space", "step07_gradient_pass", "step08_fused_softmax", "step09_one_warp",
    "step10_side_by_side", "step11_branch_free", "step12_flush_to_zero", "step13_two_passes",
    "step14_warps_per_direction",
    # formats and checks
    "BLANK", "MAX_TARGET_LENGTH", "CTCTargets", "prepare_targets", "min_frames",
    # yardsticks
    "reference_ctc", "errors", "UnderflowWarning",
    # torch's paths
    "takes_cudnn_path",
]
