"""Chapter 4: CTC loss and its gradient with respect to the activations, in CUDA C++.

The operation is warp-ctc's and cuDNN's: activations (pre-softmax logits) ``(T, N, A)``, one target label sequence
per utterance, input and target lengths, blank = 0; out come the loss per utterance ``loss[N]`` and the gradient of
``loss.sum()`` with respect to the activations ``grad[T, N, A]`` (softmax included).

Ten steps, each a public function ``stepNN_<slug>`` with the same arguments (``CHAPTER.steps`` lists them; each
one's docstring says what it changes): steps 1 to 6 (``warpctc``) follow warp-ctc's design, a softmax kernel, then
one block per utterance for alpha and one for beta and the gradient (``__restrict__``, ``__ldg``, register
blocking, shared rows; step 6 is the probability-space counterexample, which estimates its own underflow and
warns); steps 7 to 10 (``fused``) never write the softmax out and run alpha and beta side by side, one warp (steps
7 to 9) or a block of warps (step 10) per direction. :func:`ctc_loss` is the chapter's result: step 8 or 10, as
:func:`~studylog.ctc.fused.final_step` picks for the shape.

Every log-space step renormalises its rows by their maximum at every frame (the loss adds the maxima up in float64)
and divides each frame's posterior by its own sum: plain float32 log space loses about 1e-4 of relative accuracy
in the gradient at T = 150, the whole error budget. Targets are validated and packed once per batch by
:func:`prepare_targets`; with prepared targets every step can be captured in a CUDA graph (step 6 with
``warn=False``), and :class:`CTCPlan` replays one graph over changing batches.

Modules: ``targets`` (formats and checks), ``reference`` (float64 reference, the CPU model of step 6, errors),
``warpctc``, ``fused``, ``plan``, ``compiled`` (NVRTC's output for a step), ``peers`` (torch's two paths),
``report`` (benchmark), ``results`` (headline); CUDA sources in ``csrc/``. Figures, tables and exercises are the
book's (``book.ctc``).
"""

from __future__ import annotations

from studylog import runtime  # noqa: F401  (runtime: GPU or interpreter is chosen first)
from studylog.chapter import Chapter, Step
from studylog.ctc import report, results
from studylog.ctc.compiled import compile_step
from studylog.ctc.fused import (BLOCK_GRAINS, DEFAULT_BLOCK_GRAIN, DEFAULT_RECURSION, MAX_RECURSION_WARPS,
                                RECURSION_OPTIONS, WARP_GRAINS, ctc_loss, fused_kernel_names, preload_fused,
                                recursion_name, recursion_warps, step07_fused_softmax, step08_branch_free,
                                step09_two_passes, step10_warps_per_direction, warp_grain)
from studylog.ctc.peers import (CUDNN_TARGET_LIMIT, capturable, concatenated, cudnn_eligible, padded,
                                takes_cudnn_path)
from studylog.ctc.plan import CTCPlan
from studylog.ctc.reference import (FAR_GRAD, FAR_LOSS, GRAD_TOLERANCE, LOSS_TOLERANCE, UNDERFLOW_TOLERANCE, errors,
                                    outcomes, probability_space_ctc, reference_ctc, silently_wrong,
                                    untrusted, wrong_utterances)
from studylog.ctc.report import (BENCH_A, BENCH_N, BENCH_T, LESSON_N, LONG_T, STRESS_A, STRESS_N, STRESS_T,
                                 dram_bytes, grids, kernel_times_us, long_inputs, random_targets,
                                 stress_inputs, stress_set)
from studylog.ctc.targets import (BLANK, MAX_TARGET_LENGTH, CTCTargets, min_frames, prepare_targets,
                                  validate_lengths)
from studylog.ctc.warpctc import (GRAIN_SIZES, UnderflowWarning, block_threads, default_grain,
                                  kernel_names, preload_blocked, step01_baseline, step02_restrict, step03_ldg,
                                  step04_register_blocking, step05_shared_rows, step06_probability_space,
                                  untrusted_answers)
from studylog.ctc import ops  # the entry point as a torch.library operator (torch.ops.studylog)


def _csrc(name: str):
    from studylog import paths

    return paths.chapter_csrc("ctc") / f"{name}.cu"


#: What each step changes (the chapter's table of steps), by its function ``stepNN_<slug>``.
_TITLES = {
    step01_baseline: "warp-ctc's design: alpha matrix in global memory, gradient in the beta kernel",
    step02_restrict: "every pointer __restrict__",
    step03_ldg: "read-only loads through __ldg",
    step04_register_blocking: "a thread's positions, labels and skips in registers (grain size)",
    step05_shared_rows: "the alpha kernel's two live rows in shared memory",
    step06_probability_space: "probabilities rescaled every frame instead of logs (the counterexample)",
    step07_fused_softmax: "no softmax written: emissions, one warp per direction, fused gradient",
    step08_branch_free: "the warp recursion without its divergent branch",
    step09_two_passes: "softmax written by the first pass, target's classes corrected in place",
    step10_warps_per_direction: "the recursion over several warps per direction",
}
#: Each step's ``.cu`` file (in ``csrc``) and the kernel (or device function) of it that the lesson shows.
_SHOWN = {
    1: ("ctc_step01_baseline", "ctc_alpha_step1"), 2: ("ctc_step02_03_restrict_ldg", "ctc_alpha_restrict"),
    3: ("ctc_step02_03_restrict_ldg", "ctc_beta_grad_restrict"), 4: ("ctc_step04_05_blocked", "ctc_alpha_step4"),
    5: ("ctc_step04_05_blocked", "ctc_alpha_step5"), 6: ("ctc_step06_probability", "ctc_alpha_step6"),
    7: ("ctc_step07_fused_softmax", "FrameUpdate"), 8: ("ctc_step08_branch_free", "FrameUpdate"),
    9: ("ctc_step09_two_passes", "ctc_target_grad"), 10: ("ctc_step10_warps", "ctc_warps_direction"),
}


def _step(function, title: str) -> Step:
    """The step of ``function`` (``stepNN_<slug>``: its number and slug) with its title and shown kernel."""
    number, slug = function.__name__.removeprefix("step").split("_", 1)
    source, kernel = _SHOWN[int(number)]
    return Step(int(number), slug, title, "cuda", function, _csrc(source), kernel)


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

#: The last step: what the chapter's headline and targets are measured on (``ctc_loss`` runs it).
FINAL_STEP = CHAPTER.final.number

#: What a reader imports after the chapter: the entry point, its plan, the steps, the formats, the references and
#: torch's rule. Everything else imported above stays reachable here and by its module.
__all__ = [
    "CHAPTER", "ops", "ctc_loss", "CTCPlan",
    "step01_baseline", "step02_restrict", "step03_ldg", "step04_register_blocking", "step05_shared_rows",
    "step06_probability_space", "step07_fused_softmax", "step08_branch_free", "step09_two_passes",
    "step10_warps_per_direction",
    # formats and checks
    "BLANK", "MAX_TARGET_LENGTH", "CTCTargets", "prepare_targets", "min_frames",
    # yardsticks
    "reference_ctc", "probability_space_ctc", "errors", "UnderflowWarning",
    # torch's paths
    "takes_cudnn_path",
]
