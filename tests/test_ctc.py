"""Chapter 4: CTC loss. CPU: the float64 reference against torch, edge cases, validation, the
compiled code (PTX loads, registers). GPU: every step against the reference."""

import functools
import math
import re
import warnings

import numpy as np
import pytest
import torch

import lab_scripts
from book.ctc import compiled as book_compiled
from book.ctc.lesson import bank_ways
from book.ctc.model import probability_space_ctc
from studylog import ctc, cuda

SENTINEL = -12345.0  # poison for outputs: no correct loss or gradient entry takes this value
STEPS = [s.number for s in ctc.CHAPTER.steps]


def step_ids(number):
    return ctc.CHAPTER.step(number).name


def random_case(rng, T, N, A, *, max_target=12, repeats=False):
    """Activations, padded int64 targets and varied lengths; small A makes repeated labels common."""
    x = torch.randn(T, N, A, generator=rng) * 1.5
    input_lengths = torch.randint(1, T + 1, (N,), generator=rng)
    target_lengths = torch.randint(0, max_target + 1, (N,), generator=rng)
    targets = torch.randint(1, A, (N, max(1, max_target)), generator=rng)
    if repeats:  # force neighbours to repeat in every other pair
        targets[:, 1::2] = targets[:, 0::2][:, : targets[:, 1::2].shape[1]]
    return x, targets, input_lengths, target_lengths


def torch_float64(x, targets, input_lengths, target_lengths, zero_infinity=False):
    leaf = x.double().requires_grad_(True)
    loss = torch.nn.functional.ctc_loss(leaf.log_softmax(2), targets, input_lengths, target_lengths,
                                        reduction="none", zero_infinity=zero_infinity)
    (grad,) = torch.autograd.grad(loss.sum(), leaf)
    return loss.detach(), grad


def torch_ctc(x, targets, input_lengths, target_lengths):
    """torch's float32 answer (cuDNN for int32 CPU targets, else its native path): loss and autograd's gradient."""
    leaf = x.detach().requires_grad_(True)
    loss = torch.nn.functional.ctc_loss(leaf.log_softmax(2), targets, tuple(input_lengths), tuple(target_lengths),
                                        reduction="none")
    (grad,) = torch.autograd.grad(loss.sum(), leaf)
    return loss.detach(), grad


def assert_same(loss, grad, ref_loss, ref_grad, *, loss_tol=1e-9, grad_tol=1e-9):
    """Same infinities and NaNs, and close finite values."""
    assert torch.equal(torch.isinf(loss.cpu()), torch.isinf(ref_loss.cpu()))
    assert torch.equal(torch.isnan(grad.cpu()), torch.isnan(ref_grad.cpu()))
    err = ctc.errors(loss, grad, ref_loss, ref_grad)
    assert err["mismatched"] == 0, err
    assert err["loss_rel"] <= loss_tol and err["grad_rel"] <= grad_tol, err


# --------------------------------------------------------------------------------------
# The float64 reference against torch (CPU)
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("T, N, A", [(1, 1, 2), (5, 3, 4), (17, 4, 7), (40, 3, 30)])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_reference_matches_torch(T, N, A, zero_infinity, rng):
    x, targets, il, tl = random_case(rng, T, N, A, repeats=A < 10)
    loss, grad = ctc.reference_ctc(x, targets, il, tl, zero_infinity=zero_infinity)
    ref_loss, ref_grad = torch_float64(x, targets, il, tl, zero_infinity)
    assert loss.dtype == grad.dtype == torch.float64
    assert_same(loss, grad, ref_loss, ref_grad)


def test_reference_takes_concatenated_targets(rng):
    x, targets, il, tl = random_case(rng, 12, 4, 9)
    flat = torch.cat([targets[i, :l] for i, l in enumerate(tl.tolist())]).to(torch.int32)
    a = ctc.reference_ctc(x, targets, il, tl)
    b = ctc.reference_ctc(x, flat, il.tolist(), tuple(tl.tolist()))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1].nan_to_num(7.0), b[1].nan_to_num(7.0))


def test_repeated_labels_need_a_blank_between_them(rng):
    x = torch.randn(3, 1, 5, generator=rng)
    lp = x.double().log_softmax(2)[:, 0]
    assert ctc.min_frames([3, 3]) == 3 and ctc.min_frames([3, 4]) == 2 and ctc.min_frames([]) == 0
    two_frames, _ = ctc.reference_ctc(x[:2], torch.tensor([[3, 3]]), [2], [2])
    assert math.isinf(two_frames.item())  # "3 3" cannot be emitted in 2 frames: it would read "3"
    three_frames, _ = ctc.reference_ctc(x, torch.tensor([[3, 3]]), [3], [2])
    only_path = -(lp[0, 3] + lp[1, 0] + lp[2, 3])  # 3, blank, 3
    torch.testing.assert_close(three_frames[0], only_path, rtol=1e-12, atol=0)
    distinct, _ = ctc.reference_ctc(x[:2], torch.tensor([[3, 4]]), [2], [2])
    torch.testing.assert_close(distinct[0], -(lp[0, 3] + lp[1, 4]), rtol=1e-12, atol=0)


def test_empty_target_is_all_blanks(rng):
    x = torch.randn(6, 2, 4, generator=rng)
    loss, grad = ctc.reference_ctc(x, torch.zeros(2, 1, dtype=torch.long), [6, 4], [0, 0])
    probs = x.double().softmax(2)
    torch.testing.assert_close(loss, -probs[:, :, 0].log().cumsum(0)[[5, 3], [0, 1]], rtol=1e-12, atol=0)
    expected = probs.clone()
    expected[:, :, 0] -= 1.0  # every frame is the blank with posterior 1
    expected[4:, 1] = 0.0  # past utterance 1's input length
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


def test_target_too_long_gives_infinite_loss(rng):
    x = torch.randn(4, 2, 6, generator=rng)
    targets = torch.tensor([[1, 2, 3, 4, 5], [2, 2, 0, 0, 0]])
    il, tl = [4, 3], [5, 2]  # 5 labels in 4 frames; "2 2" fits 3 frames
    loss, grad = ctc.reference_ctc(x, targets, il, tl)
    ref_loss, ref_grad = torch_float64(x, targets, torch.tensor(il), torch.tensor(tl))
    assert math.isinf(loss[0]) and math.isfinite(loss[1])
    assert torch.isnan(grad[:, 0]).all() and not torch.isnan(grad[:, 1]).any()
    assert_same(loss, grad, ref_loss, ref_grad)
    loss, grad = ctc.reference_ctc(x, targets, il, tl, zero_infinity=True)
    assert loss[0] == 0 and (grad[:, 0] == 0).all()
    assert_same(loss, grad, *torch_float64(x, targets, torch.tensor(il), torch.tensor(tl), zero_infinity=True))


def test_probability_space_rescaling_breaks_on_long_blank_heavy_input():
    gen = torch.Generator().manual_seed(0)
    for T, breaks in [(60, False), (240, True)]:
        x, lists = ctc.stress_inputs(T, 2, 12, gen, "cpu")
        targets, tl = ctc.padded(lists), [len(l) for l in lists]
        ref, ref_grad = ctc.reference_ctc(x, targets, [T, T], tl)
        prob32, grad32, estimate = probability_space_ctc(x, targets, [T, T], tl)
        prob64, grad64, _ = probability_space_ctc(x, targets, [T, T], tl, dtype=torch.float64)
        assert torch.isfinite(ref).all()
        torch.testing.assert_close(prob64, ref, rtol=1e-10, atol=0)  # double still holds at this length
        torch.testing.assert_close(grad64, ref_grad, rtol=0, atol=1e-9)
        if breaks:
            assert torch.isinf(prob32).all() and torch.isinf(estimate).all(), prob32
            assert ctc.reference.untrusted(estimate, prob32, [T, T], lists).all()
        else:
            torch.testing.assert_close(prob32.double(), ref, rtol=1e-5, atol=0)
            assert not ctc.reference.wrong_utterances(prob32, grad32, ref, ref_grad).any()


def test_probability_space_model_matches_the_reference_where_nothing_underflows(rng):
    """Short, ordinary inputs (awkward sizes, repeats, varied lengths): nothing falls below float's
    normal range, the estimate is 0 and the float32 model is the reference within the tolerances."""
    x, targets, il, tl = random_case(rng, 17, 5, 7, max_target=6, repeats=True)
    il[0], tl[0] = 17, 6
    ref_loss, ref_grad = ctc.reference_ctc(x, targets, il, tl)
    loss, grad, estimate = probability_space_ctc(x, targets, il, tl)
    feasible = torch.isfinite(ref_loss)
    assert (estimate[feasible] < ctc.reference.UNDERFLOW_TOLERANCE).all(), estimate
    assert torch.isinf(loss[~feasible]).all() and torch.isinf(estimate[~feasible]).all()
    assert not ctc.reference.wrong_utterances(loss, grad, ref_loss, ref_grad).any()
    lists = [targets[i, :l].numpy() for i, l in enumerate(tl.tolist())]
    assert not ctc.reference.untrusted(estimate, loss, il, lists).any()


def test_silently_wrong_counts_only_finite_answers_without_nan():
    ref_loss = torch.tensor([10.0, 10.0, 10.0, math.inf], dtype=torch.float64)
    ref_grad = torch.zeros(2, 4, 3, dtype=torch.float64)
    loss = torch.tensor([10.0, 11.0, 11.0, math.inf])
    grad = torch.zeros(2, 4, 3)
    grad[0, 2, 0] = math.nan  # utterance 2: wrong and shows it
    assert ctc.reference.wrong_utterances(loss, grad, ref_loss, ref_grad).tolist() == [False, True, True, False]
    assert ctc.errors(loss, grad, ref_loss, ref_grad)["silently_wrong"] == 1


def test_prepared_slots_list_every_position_once(rng):
    x, targets, il, tl = random_case(rng, 20, 6, 5, max_target=15, repeats=True)
    batch = ctc.prepare_targets(targets, il, tl, num_classes=5, max_time=20, device="cpu")
    for i, length in enumerate(tl.tolist()):
        labels = targets[i, :length].tolist()
        u = int(batch.num_slots[i])
        classes = batch.slot_class[i, :u].tolist()
        assert classes[0] == 0 and len(set(classes)) == u == len(set(labels)) + 1
        positions = []
        for slot in range(1, u):
            start, end = int(batch.slot_start[i, slot]), int(batch.slot_start[i, slot + 1])
            members = batch.slot_members[i, start:end].tolist()
            assert all(labels[j - 1] == classes[slot] for j in members)
            positions += members
        assert sorted(positions) == list(range(1, length + 1))
    assert batch.labels.dtype == torch.int32 and batch.max_positions == 2 * batch.label_stride + 1


def test_launch_shapes():
    assert ctc.warpctc.default_grain(301) == 3 and ctc.warpctc.block_threads(301, 3) == 128
    assert ctc.warpctc.block_threads(301, 1) == 320 and ctc.warpctc.block_threads(3, 8) == 32
    assert ctc.warp_grain(3) == 2 and ctc.warp_grain(301) == 10 and ctc.warp_grain(1023) == 32
    with pytest.raises(ValueError, match="one warp"):
        ctc.warp_grain(1025)
    assert ctc.report.dram_bytes(150, 256, 5000) == 2 * 4 * 150 * 256 * 5000
    assert ctc.fused.recursion_warps(301, 4) == 3 and ctc.fused.recursion_warps(301, 2) == 5
    warps = ctc.fused.recursion_warps
    assert warps(1023, 4) == 8 and warps(1023, 2) == 16 and warps(3, 4) == 1
    with pytest.raises(ValueError, match="at most"):
        ctc.fused.recursion_warps(1100, 2)


def test_bank_conflict_model():
    assert [bank_ways(g, blocked=False) for g in range(1, 9)] == [1] * 8
    assert [bank_ways(g, blocked=True) for g in range(1, 9)] == [1, 2, 1, 4, 1, 2, 1, 8]


# --------------------------------------------------------------------------------------
# Bad input: a clear error naming the argument, before any launch
# --------------------------------------------------------------------------------------

def _args(**change):
    args = dict(activations=torch.randn(6, 2, 5), targets=torch.tensor([[1, 2, 3], [4, 4, 0]]),
                input_lengths=torch.tensor([6, 5]), target_lengths=torch.tensor([3, 2]))
    args.update(change)
    return args


@pytest.mark.parametrize("change, error, match", [
    (dict(targets=torch.tensor([[1, 0, 3], [4, 4, 0]])), ValueError, "blank"),
    (dict(targets=torch.tensor([[1, 2, 5], [4, 4, 0]])), ValueError, "outside"),
    (dict(targets=torch.tensor([[1, -2, 3], [4, 4, 0]])), ValueError, "outside"),
    (dict(targets=torch.tensor([[1.0, 2.0, 3.0], [4.0, 4.0, 0.0]])), TypeError, "int32 or int64"),
    (dict(targets=torch.tensor([1, 2, 3, 4])), ValueError, "concatenated"),
    (dict(targets=torch.tensor([[1, 2], [4, 4]])), ValueError, "columns"),
    (dict(targets=torch.zeros(2, 3, 1, dtype=torch.long)), ValueError, "1-D .* or 2-D"),
    (dict(input_lengths=torch.tensor([6, 0])), ValueError, "input_lengths"),
    (dict(input_lengths=torch.tensor([7, 5])), ValueError, "input_lengths"),
    (dict(input_lengths=torch.tensor([6.0, 5.0])), TypeError, "input_lengths"),
    (dict(input_lengths=torch.tensor([6, 5, 4])), ValueError, "input_lengths .* N = 2"),
    (dict(target_lengths=torch.tensor([3, -1])), ValueError, "target_lengths"),
    (dict(target_lengths=torch.tensor([3, ctc.MAX_TARGET_LENGTH + 1])), ValueError, "target_lengths"),
    (dict(target_lengths="3, 2"), TypeError, "target_lengths"),
    (dict(activations=torch.randn(6, 2, 5, dtype=torch.float64)), TypeError, "float32"),
    (dict(activations=torch.randn(6, 5)), ValueError, r"\(T, N, A\)"),
    (dict(activations=torch.randn(5, 2, 6).transpose(0, 2)), ValueError, "contiguous"),
    (dict(activations=torch.randn(6, 2, 5)), ValueError, "CUDA device"),
])
def test_bad_input_is_named(change, error, match):
    with pytest.raises(error, match=match):
        ctc.ctc_loss(**_args(**change))


def test_bad_call_options_are_named():
    args = _args()
    batch = ctc.prepare_targets(args["targets"], args["input_lengths"], args["target_lengths"], num_classes=5,
                                max_time=6, device="cpu")
    x = args["activations"]
    with pytest.raises(ValueError, match="either prepared"):
        ctc.ctc_loss(x, batch, args["input_lengths"], args["target_lengths"])
    with pytest.raises(ValueError, match="A = 6"):
        ctc.ctc_loss(torch.randn(6, 2, 6), batch)
    with pytest.raises(ValueError, match="N = 3"):
        ctc.step10_side_by_side(torch.randn(6, 3, 5), batch)
    with pytest.raises(ValueError, match="T = 4"):
        ctc.step01_baseline(torch.randn(4, 2, 5), batch)
    with pytest.raises(ValueError, match="grain must be one of"):
        ctc.kernel_names(4, 9)
    with pytest.raises(ValueError, match="grain must be one of"):
        ctc.step05_shared_rows(x, batch, grain=0)
    with pytest.raises(ValueError, match="grain must be one of"):
        ctc.step06_probability_space(x, batch, grain=9)
    with pytest.raises(ValueError, match="share memory"):
        ctc.ctc_loss(x, batch, out_grad=x)
    with pytest.raises(ValueError, match="num_classes"):
        ctc.prepare_targets(args["targets"], [6, 5], [3, 2], num_classes=1, max_time=6)
    for step in (ctc.step07_gradient_pass, ctc.step08_fused_softmax, ctc.step09_one_warp, ctc.step10_side_by_side):
        with pytest.raises(TypeError):
            step(x, batch, grain=3)  # no grain: step 5's rule (7, 8) or one warp per direction (9, 10)
    for step in (ctc.step07_gradient_pass, ctc.step11_branch_free):
        with pytest.raises(TypeError):
            step(x, batch, recursion="branch-free")  # one recursion each
    with pytest.raises(ValueError, match="recursion must be one of"):
        ctc.step13_two_passes(x, batch, recursion="fastest")
    with pytest.raises(ValueError, match="recursion must be one of"):
        ctc.step12_flush_to_zero(x, batch, recursion="fastest")
    with pytest.raises(ValueError, match="recursion must be one of"):
        ctc.recursion_name(10, "fastest")
    with pytest.raises(ValueError, match="positions per lane"):
        ctc.recursion_name(7)
    for step in (7, 8, 9, 10, 11, 14):
        with pytest.raises(ValueError, match="steps 12 and 13"):
            ctc.fused.fused_kernel_names(step, 4, "branch-free")
    with pytest.raises(ValueError, match="positions per thread"):
        ctc.fused.fused_kernel_names(7, 9)  # step 5's grains: 1 to 8
    with pytest.raises(ValueError, match="positions per lane"):
        ctc.fused.fused_kernel_names(9, 3)  # a lane starts on a blank: even
    with pytest.raises(ValueError, match=r"grain must be one of \(2, 4\) for step 14"):
        ctc.step14_warps_per_direction(x, batch, grain=3)
    with pytest.raises(ValueError, match="positions per thread"):
        ctc.fused.fused_kernel_names(14, 3)
    with pytest.raises(ValueError, match="steps 7 to 14"):
        ctc.fused.fused_kernel_names(6, 4)
    with pytest.raises(TypeError, match="out_estimate must be float32"):
        ctc.step06_probability_space(x, batch, out_estimate=torch.empty(2, dtype=torch.float64))


def test_the_final_step_is_the_entry_point():
    assert ctc.CHAPTER.final.function is ctc.step14_warps_per_direction is not None
    assert ctc.CHAPTER.final.number == 14 and [s.number for s in ctc.CHAPTER.steps] == list(range(1, 15))
    assert ctc.CHAPTER.label("step06") == "step06_probability_space"
    assert ctc.ops.STEP == ctc.CHAPTER.final.number
    rule = ctc.fused.final_step
    assert rule(150, 8, 28, 33) == rule(150, 1, 28, 128) == 12 and rule(150, 8, 5000, 33) == 13  # one warp holds it
    assert rule(150, 8, 28, 129) == rule(150, 8, 5000, 301) == rule(150, 1, 28, 405) == 14      # several warps
    assert rule(150, 256, 28, 297) == 12 and rule(150, 256, 28, 393) == rule(150, 256, 5000, 297) == 14
    for bad in (0, -3, 1.5, None):
        with pytest.raises((TypeError, ValueError), match="max_positions"):
            rule(150, 1, 28, bad)


def test_entry_series_names_the_step_the_entry_point_dispatches_to(monkeypatch):
    """The results files' rule (results.entry_series) against ctc_loss's own dispatch: each step the entry point may
    run is replaced by a recorder, so a change to either side that makes them disagree fails here."""
    from studylog.ctc.results import entry_series

    from studylog.plotting import Results

    ran = []
    for step in (ctc.step12_flush_to_zero, ctc.step13_two_passes, ctc.step14_warps_per_direction):
        number = ctc.CHAPTER.step(step.__name__[:6]).number
        monkeypatch.setattr(ctc.fused, step.__name__, lambda *args, number=number, **kwargs: ran.append(number))
    for T in (2, 150, 400):
        for N in (1, 2, 8, 255, 256):
            for A in (2, 28, 1024, 1025, 5000):
                for L in {1, min(T, 63), min(T, 64), min(T, 159), min(T, 160), min(T, 200)}:
                    if L > T:
                        continue
                    ctc.ctc_loss(torch.empty(T, N, A), torch.ones(N, L, dtype=torch.long), (T,) * N, (L,) * N)
                    where = {"T": T, "N": N, "A": A}
                    step_rows = Results(None, {"measurements": [{"series": "step14", "params": where, "ms": 1.0,
                                                                 "max_positions": 2 * L + 1}]})
                    series = entry_series(step_rows, **where)
                    assert series == f"step{ran[-1]:02d}", (T, N, A, L)
                    assert ctc.fused.launch_shape(ctc.CHAPTER.step(series).number, 3)  # a step of the fused family
                    timed = Results(None, {"measurements": [{"series": "ctc_loss", "params": where, "ms": 1.0}]})
                    assert entry_series(timed, **where) == "ctc_loss"
    assert set(ran) == {12, 13, 14}
    assert entry_series(Results(None, {"measurements": []}), T=150, N=1, A=28) == ""
    for name, bad in (("T", 0), ("N", 1.5), ("A", True)):
        with pytest.raises(ValueError, match=f"{name} must be a positive int"):
            entry_series(Results(None, {"measurements": []}), **({"T": 150, "N": 1, "A": 28} | {name: bad}))


def test_each_step_from_7_on_changes_one_kernel_of_the_step_it_builds_on():
    """Steps 7 to 14 as (first pass, recursion, last pass): step 8 changes both passes and where the recursion reads
    its emissions (one template flag of step 7's kernel), every later step one kernel of the three (step 13 both
    passes, one idea: the softmax written by the first), and steps 12 and 13 share their recursion."""
    names = {k: ctc.fused.fused_kernel_names(k, 2) for k in range(7, 14)} | {14: ctc.fused.fused_kernel_names(14, 2)}
    assert names[7][1] == "ctc_block_recursion<2, true>" and names[8][1] == "ctc_block_recursion<2, false>"
    assert names[8][0] != names[7][0] and names[8][2] != names[7][2]
    changed = {k: [i for i in range(3) if names[k][i] != names[k - 1][i]] for k in range(9, 15)}
    assert changed == {9: [1], 10: [1], 11: [1], 12: [1], 13: [0, 2], 14: [1]}, changed
    assert names[11][1] == ctc.recursion_name(2, "branch-free") and names[12][1] == ctc.recursion_name(2)
    assert ctc.fused.IN_TURN == (7, 8, 9)


def _small_batch():
    """(T, N, A, targets) of three utterances, small enough to read every launch's arguments."""
    T, N, A = 5, 3, 7
    batch = ctc.prepare_targets(torch.tensor([[1, 2], [3, 0], [2, 2]]), [5, 4, 5], [2, 1, 2], num_classes=A,
                                max_time=T, device="cpu")
    return T, N, A, batch


class _RecordingKernel:
    """Stands in for a compiled kernel: each launch is appended to ``calls`` as (name, grid, block, args)."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __call__(self, grid, block, *args):
        self.calls.append((self.name, grid, block, args))


def test_every_launch_passes_what_each_kernel_declares():
    """Each step's three launches (steps 7 to 14) with fake kernels: as many arguments as the kernel's signature,
    grid (N, 1) where alpha and beta run in turn (7 to 9) and (N, 2) where they run side by side; and each signature
    is the kernel's parameter list in the PTX NVRTC makes of its source (64-bit pointers, 32-bit ints)."""
    import re

    T, N, A, batch = _small_batch()
    calls = []
    Fake = functools.partial(_RecordingKernel, calls=calls)

    saved = dict(ctc.fused.LAUNCHES)
    ctc.fused.LAUNCHES.clear()
    try:
        for step in range(7, 15):
            v, threads = ctc.fused.launch_shape(step, batch.max_positions)
            ctc.fused.LAUNCHES[(step, v, None)] = [Fake(n) for n in ctc.fused.fused_kernel_names(step, v)]
            calls.clear()
            x = torch.randn(T, N, A)
            ctc.fused.launch(x, batch, torch.empty(N), torch.empty(T, N, A), False, step, None)
            assert [c[0] for c in calls] == list(ctc.fused.fused_kernel_names(step, v))
            for name, grid, block, args in calls:
                assert len(args) == len(ctc.fused.SIGNATURES[name.split("<")[0]]), (step, name)
            assert calls[1][1] == ((N, 1) if step in (7, 8, 9) else (N, 2)) and calls[1][2] == (threads,)
    finally:
        ctc.fused.LAUNCHES.clear()
        ctc.fused.LAUNCHES.update(saved)
    for step in range(7, 15):
        names = ctc.fused.fused_kernel_names(step, 4)
        for source in dict.fromkeys(ctc.fused.source_of(n) for n in names):
            compiled = cuda.compile_source(source, arch="sm_90", name_expressions=[
                n for n in names if "<" in n and ctc.fused.source_of(n) == source])
            for name in (n for n in names if ctc.fused.source_of(n) == source):
                ptx = compiled.ptx_function(compiled.lowered_names.get(name, name))
                params = re.findall(r"\.param \.(\w+)", ptx[:ptx.index(")")])
                assert ["ptr" if p == "u64" else "i32" for p in params] == ctc.fused.SIGNATURES[name.split("<")[0]]


# --------------------------------------------------------------------------------------
# The compiled code (NVRTC runs without a GPU)
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def steps_1_to_3():
    return book_compiled.compile_step(1), book_compiled.compile_step(2)  # step 1's file; steps 2 and 3 share one


def test_restrict_and_ldg_make_the_read_only_loads_non_coherent(steps_1_to_3):
    one, two_three = steps_1_to_3
    rows = book_compiled.load_table(one, list(ctc.kernel_names(1)))
    rows += book_compiled.load_table(two_three, [n for s in (2, 3) for n in ctc.kernel_names(s)])
    table = dict(zip([(step, kind) for step in (1, 2, 3) for kind in ("alpha", "beta_grad")], rows))
    for kind in ("alpha", "beta_grad"):
        assert table[1, kind]["ld.global.nc"] == 0  # aliasing possible: every load coherent
        assert table[2, kind]["ld.global.nc"] > 0   # __restrict__ alone is enough
        assert table[3, kind]["ld.global.nc"] >= table[2, kind]["ld.global.nc"]
    for step in (2, 3):
        assert table[step, "beta_grad"]["ld.global"] == 0  # nothing it reads is written
        assert table[step, "alpha"]["ld.global"] > 0  # the alpha matrix it writes itself
    assert all(row["spill_stores"] == 0 and row["registers"] > 0 for row in table.values())


@pytest.fixture(scope="module")
def blocked_kernels():
    """Steps 4 and 5 in one NVRTC call (step 4 at several grain sizes, step 5 at one), step 6 in another."""
    four = book_compiled.compile_step(4, grains=TESTED_GRAINS)
    five = book_compiled.compile_step(5, grains=[3], layouts=(False, True))
    six = book_compiled.compile_step(6, grains=[2])
    return None, (four, five, six)


TESTED_GRAINS = (1, 2, 3, 4, 8)


def test_register_report_per_grain_size(blocked_kernels):
    _, (compiled, _, _) = blocked_kernels
    rows = book_compiled.load_table(compiled, [n for g in TESTED_GRAINS for n in ctc.kernel_names(4, g)])
    assert len(rows) == 2 * len(TESTED_GRAINS)
    for row in rows:
        assert row["registers"] > 0 and row["spill_stores"] == 0 and row["spill_loads"] == 0, row
        assert row["ld.global.nc"] > 0
    alpha = {g: rows[2 * i]["registers"] for i, g in enumerate(TESTED_GRAINS)}
    assert alpha[8] > alpha[1]  # more positions per thread, more live registers


def test_template_instances_of_steps_5_and_6_compile(blocked_kernels):
    _, (_, five, six) = blocked_kernels
    wanted = [(five, [n for b in (False, True) for n in ctc.kernel_names(5, 3, b)]), (six, list(ctc.kernel_names(6, 2)))]
    for compiled, names in wanted:
        assert set(names) <= set(compiled.lowered_names)
        report = compiled.ptxas_report()
        assert all(compiled.lowered_names[n] in report for n in names)
        assert all(r["spill_stores"] == 0 for r in report.values())


def test_steps_7_to_10_compile_without_spills():
    """Steps 7 to 10's kernels (one file) at the smallest, a middle and the largest grain they launch: no stack frame
    and no spills; steps 7 and 8 share one block recursion whose template flag says where the emissions come from
    (the log-softmax for step 7: a load of a label's class first, then of its entry of the frame)."""
    grains = {7: (1, 3, 8), 8: (1, 3, 8), 9: (2, 10, 32), 10: (2, 10, 32)}
    names = list(dict.fromkeys(n for k, vs in grains.items() for v in vs for n in ctc.fused.fused_kernel_names(k, v)))
    assert {ctc.fused.source_of(n) for n in names} == {"ctc_step07_10_three_passes"}
    compiled = cuda.compile_source("ctc_step07_10_three_passes", arch="sm_90",
                                   name_expressions=[n for n in names if "<" in n])
    report = compiled.ptxas_report()
    assert {compiled.lowered_names.get(n, n) for n in names} <= set(report)
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack_bytes"] == 0 for r in report.values())
    seven, eight = (compiled.ptx_function(f"ctc_block_recursion<3, {flag}>") for flag in ("true", "false"))
    assert seven.count("ld.global.nc.u32") > eight.count("ld.global.nc.u32")  # the label's class, then its entry
    in_turn, side_by_side = (compiled.ptx_function(f"{k}<10>") for k in ("ctc_warp_recursion_in_turn",
                                                                          "ctc_fused_recursion"))
    assert "%ctaid.y" in side_by_side and "%ctaid.y" not in in_turn  # blockIdx.y picks alpha or beta


def _code(ptx: str) -> str:
    """One kernel's PTX without what names it: mangled names (the entry, its parameters, its shared arrays) and
    branch labels made uniform; module-level declarations, comments and debug lines left out."""
    lines = [line for line in ptx.splitlines()
             if not re.match(r"\.(shared|global|const)\b|\s*//|\s*\.(loc|file)\b", line)]
    return re.sub(r"\$L__BB\d+_", "$L__BB_", re.sub(r"_Z\w+", "_Z", "\n".join(lines)))


def _step07_script():
    """``lab/ctc/step07_changes.py``, which takes step 7 apart (its ``PARTS``, 7a and 7b)."""
    return lab_scripts.load("ctc", "step07_changes")


def _step07_parts_functions() -> dict:
    """7a and 7b, as ``lab/ctc/step07_changes.py`` runs them."""
    script = _step07_script()
    return {part: script.FUNCTIONS[part] for part in script.PARTS}


@pytest.fixture(scope="module")
def step07_parts():
    """Step 7's recursion and its parts 7a and 7b (the knobs of ctc_block_recursion_knobs) at the smallest, the
    benchmark's and the largest grain, and step 7's and 8's kernels spelled out with the knobs at their values."""
    grains = (1, 3, 8)
    script = _step07_script()
    names = [n for v in grains for n in ctc.fused.fused_kernel_names(7, v) if "<" in n]
    names += [n for v in grains for part in script.PARTS for n in script.part_kernel_names(part, v) if "<" in n]
    names += ["ctc_block_recursion<3, false>"]
    knobbed = {f"ctc_block_recursion<3, {flag}>": f"ctc_block_recursion_knobs<3, {flag}, 3, "
               f"{book_compiled.PREFETCH_FRAMES}>" for flag in ("true", "false")}
    names = list(dict.fromkeys(names + list(knobbed.values())))
    compiled = cuda.compile_source(script.SOURCE, arch="sm_90", name_expressions=names)
    return compiled, names, knobbed, script


def test_step07_parts_are_step_7s_kernel_with_knobs(step07_parts):
    """7a and 7b launch instances of the one kernel template in step 7's source (no copy of the kernel): with the
    knobs at step 7's values (alpha then beta in one kernel, PREFETCH frames ahead) it compiles to step 7's and step
    8's recursion, instruction for instruction. Every part compiles without spills, as step 7 does; 7a's two launches
    hold between them the barriers of 7b's one kernel, and 7b unrolls fewer frames than step 7 (no prefetch)."""
    compiled, names, knobbed, script = step07_parts
    assert script.SOURCE == ctc.fused.source_of("ctc_block_recursion") == "ctc_step07_10_three_passes"
    source = cuda.read_source("ctc_step07_10_three_passes")
    assert f"#define PREFETCH {book_compiled.PREFETCH_FRAMES}\n" in source
    assert source.count("void block_direction_rows(") == 1 and source.count("__global__ void ctc_block_recursion") == 2
    for shipped, spelled in knobbed.items():
        assert _code(compiled.ptx_function(shipped)) == _code(compiled.ptx_function(spelled)), shipped
    report = compiled.ptxas_report()
    assert {compiled.lowered_names[n] for n in names} <= set(report)
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack_bytes"] == 0 for r in report.values())
    for v in (1, 3, 8):
        seven = ctc.fused.fused_kernel_names(7, v)[1:-1]
        a, b = (script.part_kernel_names(part, v)[1:-1] for part in ("7a", "7b"))
        assert len(seven) == len(b) == 1 and len(a) == 2
        bars = {k: sum(compiled.ptx_function(n).count("bar.sync") for n in names)
                for k, names in (("7", seven), ("7a", a), ("7b", b))}
        assert bars["7a"] == bars["7b"] < bars["7"], (v, bars)
        assert all("%ctaid.y" not in compiled.ptx_function(n) for n in seven + a + b)


def test_step07_parts_launch_alpha_then_beta():
    """7a launches ctc_block_recursion_knobs twice, alpha's then beta's, between step 7's two passes; 7b once;
    each with step 7's grid (N, 1), block and arguments (the lab script's launch against the library's step 7:
    the same arguments but the workspace's addresses, which each call allocates anew)."""
    T, N, A, batch = _small_batch()
    calls = []
    Fake = functools.partial(_RecordingKernel, calls=calls)
    script = _step07_script()

    saved = dict(ctc.fused.LAUNCHES)
    v, threads = ctc.fused.launch_shape(7, batch.max_positions)
    x, loss, grad = torch.randn(T, N, A), torch.empty(N), torch.empty(T, N, A)
    out = {}
    try:
        ctc.fused.LAUNCHES[(7, v, None)] = [Fake(n) for n in ctc.fused.fused_kernel_names(7, v)]
        ctc.fused.launch(x, batch, loss, grad, False, 7, None)
        out[None] = list(calls)
        for part in script.PARTS:
            script._LAUNCH[(part, v)] = [Fake(n) for n in script.part_kernel_names(part, v)]
            calls.clear()
            script.launch_part(x, batch, loss, grad, False, part)
            out[part] = list(calls)
    finally:
        ctc.fused.LAUNCHES.clear()
        ctc.fused.LAUNCHES.update(saved)

    def same(a, b) -> bool:  # the same tensor, the same number, or both an address in a call's workspace
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return a is b
        return a == b or min(a, b) > 2**20
    assert [c[0] for c in out["7a"]] == ["ctc_log_softmax_frames", f"ctc_block_recursion_knobs<{v}, true, 1, 0>",
                                         f"ctc_block_recursion_knobs<{v}, true, 2, 0>", "ctc_grad_from_log_softmax"]
    assert [c[0] for c in out["7b"]] == ["ctc_log_softmax_frames", f"ctc_block_recursion_knobs<{v}, true, 3, 0>",
                                         "ctc_grad_from_log_softmax"]
    recursion = out[None][1]
    for name, grid, block, args in out["7a"][1:-1] + out["7b"][1:-1]:
        assert grid == recursion[1] == (N, 1) and block == recursion[2] == (threads,)
        assert len(args) == len(ctc.fused.SIGNATURES["ctc_block_recursion"]) == len(recursion[3])
        assert all(same(a, b) for a, b in zip(args, recursion[3])), name
    for part in script.PARTS:  # the passes around the recursion are step 7's, with step 7's arguments
        for mine, library in ((out[part][0], out[None][0]), (out[part][-1], out[None][-1])):
            assert mine[:3] == library[:3] and len(mine[3]) == len(library[3])
            assert all(same(a, b) for a, b in zip(mine[3], library[3])), mine[0]
    with pytest.raises(ValueError, match="steps 12 and 13"):
        ctc.fused.fused_kernel_names(7, 3, "7a")  # the library's step 7 has one recursion
    parts = _step07_parts_functions()
    assert set(parts) == set(script.PARTS) == {"7a", "7b"}
    x = torch.randn(4, 2, 5)
    for function in parts.values():  # step 7's checks, before any launch
        with pytest.raises(ValueError, match="must be a positive int|input_lengths"):
            function(x, torch.tensor([[1], [2]]), [4, 9], [1, 1])
        with pytest.raises(TypeError):
            function(x, torch.tensor([[1], [2]]), [4, 4], [1, 1], recursion="7b")


@pytest.fixture(scope="module")
def recursions_at_v10():
    """Step 10's recursion and steps 11 and 12's (every option) for 32 x 10 positions, the benchmark's usual size."""
    options = list(ctc.fused.RECURSION_OPTIONS)
    return (book_compiled.compile_step(10, grains=[10]),
            book_compiled.compile_step(12, grains=[10], recursions=options))


def test_steps_11_to_14_compile_without_spills(recursions_at_v10):
    _, twelve = recursions_at_v10
    report = twelve.ptxas_report()
    names = [ctc.recursion_name(10, option) for option in ctc.fused.RECURSION_OPTIONS]
    assert {twelve.lowered_names[n] for n in names} <= set(report)
    eleven = book_compiled.compile_step(11, grains=[10])
    assert set(eleven.lowered_names) == {ctc.recursion_name(10, "branch-free")}  # step 11's recursion, no option
    report.update(book_compiled.compile_step(13).ptxas_report())
    assert {"ctc_stats_softmax", "ctc_target_grad"} <= set(report)
    fourteen = book_compiled.compile_step(14, grains=ctc.fused.BLOCK_GRAINS)
    report.update(fourteen.ptxas_report())
    assert {fourteen.lowered_names[f"ctc_warps_recursion<{v}>"] for v in ctc.fused.BLOCK_GRAINS} <= set(report)
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in report.values()), report
    ptx = {option: twelve.ptx_function(ctc.recursion_name(10, option)) for option in ctc.fused.RECURSION_OPTIONS}
    assert "ex2.approx.ftz.f32" not in ptx["branch-free"] and "redux.sync" not in ptx["branch-free"]
    assert "ex2.approx.ftz.f32" in ptx["+ ftz ex2/lg2"] and "redux.sync" not in ptx["+ ftz ex2/lg2"]
    assert "ex2.approx.ftz.f32" in ptx["+ redux max"] and "redux.sync" in ptx["+ redux max"]


def test_branch_free_recursion_has_no_divergent_regions_per_frame(recursions_at_v10):
    """SASS: step 10 opens a divergent region (BSSY) at every label position of every unrolled frame;
    steps 11 and 12 only in their set-up, and compute fewer transcendentals (no duplicated ex2 per branch)."""
    if book_compiled.nvdisasm_path() is None:
        pytest.skip("nvdisasm is not available (neither on the PATH nor in Triton's wheel)")
    ten, twelve = recursions_at_v10
    old = book_compiled.sass_counts(ten, ["ctc_fused_recursion<10>"])[0]
    options = ctc.fused.RECURSION_OPTIONS
    rows = book_compiled.sass_counts(twelve, [ctc.recursion_name(10, o) for o in options])  # one disassembly
    new = dict(zip(ctc.fused.RECURSION_OPTIONS, rows))
    frames = 2 * 4  # two directions, four frames unrolled
    # the set-up (skip flags) has the same regions in both; step 10 adds one per label position of
    # every unrolled frame (5 labels per lane at V = 10), steps 11 and 12 none: unrolling twice as many
    # frames (prefetch 8) adds no region
    assert old["BSSY"] - new["branch-free"]["BSSY"] >= frames * 5
    assert len({row["BSSY"] for row in new.values()}) == 1
    for option, row in new.items():
        assert row["MUFU"] == frames * (5 * 2 + 5 * 3) * RECURSION_PREFETCH_SCALE[option], (option, row)
        assert row["MUFU"] < old["MUFU"] * RECURSION_PREFETCH_SCALE[option]
    assert new["+ redux max"]["REDUX"] > 0 and new["+ ftz ex2/lg2"]["REDUX"] == 0
    assert new["+ redux max"]["SHFL"] < new["+ ftz ex2/lg2"]["SHFL"]
    assert new["+ ftz ex2/lg2"]["instructions"] < new["branch-free"]["instructions"]


#: Frames unrolled per direction relative to the default (the prefetch distance sets the unrolling).
RECURSION_PREFETCH_SCALE = {o: ctc.fused.RECURSION_OPTIONS[o][0] // 4 for o in ctc.fused.RECURSION_OPTIONS}


# --------------------------------------------------------------------------------------
# GPU: every step against the float64 reference
# --------------------------------------------------------------------------------------

def _run_on_gpu(x, targets, il, tl, step, zero_infinity=False, **kw):
    if step == 6:
        kw = {"warn": False, **kw}  # step 6's flag has tests of its own
    return _run_function_on_gpu(ctc.CHAPTER.step(step).function, x, targets, il, tl, zero_infinity, **kw)


def _run_function_on_gpu(function, x, targets, il, tl, zero_infinity=False, **kw):
    """``function`` (a step's arguments) into poisoned outputs: it must write every entry of them."""
    T, N, A = x.shape
    out_loss = torch.full((N,), SENTINEL, device="cuda")
    out_grad = torch.full((T, N, A), SENTINEL, device="cuda")
    loss, grad = function(x.cuda(), targets.cuda(), il, tl, zero_infinity=zero_infinity, out_loss=out_loss,
                          out_grad=out_grad, **kw)
    torch.cuda.synchronize()
    assert loss.data_ptr() == out_loss.data_ptr() and grad.data_ptr() == out_grad.data_ptr()
    assert not (loss == SENTINEL).any() and not (grad == SENTINEL).any(), "outputs left unwritten"
    return loss, grad


def _check_against_reference(x, targets, il, tl, step, zero_infinity=False, **kw):
    loss, grad = _run_on_gpu(x, targets, il, tl, step, zero_infinity, **kw)
    ref_loss, ref_grad = ctc.reference_ctc(x.cuda(), targets, il, tl, zero_infinity=zero_infinity)
    assert_same(loss, grad, ref_loss, ref_grad, loss_tol=ctc.LOSS_TOLERANCE, grad_tol=ctc.GRAD_TOLERANCE)


@pytest.mark.gpu
@pytest.mark.parametrize("step", STEPS, ids=step_ids)
@pytest.mark.parametrize("T, N, A", [(1, 1, 2), (33, 7, 5), (60, 9, 37), (45, 5, 1001)])
def test_step_matches_reference_on_gpu(step, T, N, A, rng):
    x, targets, il, tl = random_case(rng, T, N, A, max_target=min(T, 40), repeats=A < 10)
    _check_against_reference(x, targets, il, tl, step)


@pytest.mark.gpu
@pytest.mark.parametrize("step", STEPS, ids=step_ids)
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_edge_cases_on_gpu(step, zero_infinity, rng):
    x = torch.randn(8, 5, 6, generator=rng)
    targets = torch.tensor([[1, 1, 2, 0, 0, 0], [3, 3, 3, 3, 3, 0], [0, 0, 0, 0, 0, 0],
                            [1, 2, 3, 4, 5, 1], [2, 2, 2, 0, 0, 0]])
    il = [8, 8, 5, 4, 3]
    tl = [3, 5, 0, 6, 3]  # repeats; 5 repeats need 9 frames (infinite); empty; too long; repeats too long
    _check_against_reference(x, targets, il, tl, step, zero_infinity)


@pytest.mark.gpu
@pytest.mark.parametrize("step, blocked, grains", [
    (4, False, (1, 2, 3, 8)), (5, True, ctc.GRAIN_SIZES), (5, False, (1, 4, 7)), (6, False, (1, 2, 3)),
    (6, True, (3, 4)),
])  # every grain where the index arithmetic is most intricate (blocked); a few elsewhere (NVRTC time)
def test_grain_sizes_on_gpu(step, blocked, grains, rng):
    x, targets, il, tl = random_case(rng, 40, 4, 11, max_target=30)
    ctc.warpctc.preload_blocked(step, grains, (blocked,))
    for grain in grains:
        _check_against_reference(x, targets, il, tl, step, grain=grain, blocked=blocked)


def _benchmark_sized(gen, A, N=16):
    lists = ctc.random_targets(ctc.BENCH_T, N, A, gen)
    x = torch.randn(ctc.BENCH_T, N, A, generator=gen)
    il = torch.randint(ctc.BENCH_T // 2, ctc.BENCH_T + 1, (N,), generator=gen)
    tl = torch.tensor([min(len(l), int(i)) for l, i in zip(lists, il)])
    return x, ctc.padded(lists), il, tl


@pytest.mark.gpu
@pytest.mark.parametrize("step", [s for s in STEPS if s != 6], ids=step_ids)
def test_benchmark_sized_inputs_on_gpu(step, rng):
    gen = torch.Generator().manual_seed(rng.seed_value)
    for A in ctc.BENCH_A:
        _check_against_reference(*_benchmark_sized(gen, A), step)


@pytest.mark.gpu
def test_probability_space_at_benchmark_size_on_gpu(rng):
    """Step 6 is right where float32 holds the alignments; where it loses them, it loses them
    visibly and only for long targets, whose alignments have little slack: an infinite loss when
    alpha underflows, or a finite loss with a NaN gradient when, at some frame, no position keeps
    both an alpha and a beta above float's range (the frame's posteriors sum to 0)."""
    gen = torch.Generator().manual_seed(rng.seed_value)
    for A in ctc.BENCH_A:
        x, targets, il, tl = _benchmark_sized(gen, A, N=32)
        loss, grad = _run_on_gpu(x, targets, il, tl, 6)
        ref_loss, ref_grad = ctc.reference_ctc(x.cuda(), targets, il, tl)
        ref_loss = ref_loss.cpu()
        nan_gradient = torch.isnan(grad).any(dim=2).any(dim=0).cpu()
        held = torch.isfinite(loss.cpu()) & torch.isfinite(ref_loss) & ~nan_gradient
        lost = torch.isfinite(ref_loss) & ~held
        assert (tl[lost] > il[lost] // 2).all(), (tl[lost], il[lost])
        err = ctc.errors(loss[held.cuda()], grad[:, held.cuda()], ref_loss[held], ref_grad[:, held.cuda()])
        assert err["mismatched"] == 0 and err["loss_rel"] <= 1e-3 and err["grad_rel"] <= 1e-2, err


@pytest.mark.gpu
@pytest.mark.parametrize("step", range(7, 15), ids=step_ids)
def test_fused_scalar_and_vector_paths_on_gpu(step, rng):
    # offset 1: rows not 16-byte aligned; 8200: aligned, but too long for step 13's frame in registers
    for A, offset in [(5000, 0), (5000, 1), (4999, 0), (28, 0), (8200, 0)]:
        x, targets, il, tl = random_case(rng, 20, 3, A, max_target=10)
        storage = torch.empty(x.numel() + offset, device="cuda")
        shifted = storage[offset:].view(x.shape)  # contiguous, 16-byte aligned only when offset == 0
        shifted.copy_(x)
        assert (shifted.data_ptr() % 16 == 0) == (offset == 0)
        _check_against_reference(shifted, targets, il, tl, step)


def _same_bits(a, b) -> bool:
    """Whether two float tensors hold the same bits (NaNs and signed zeros included)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def _awkward_cases_on_gpu(rng, large_a: int):
    """(x, x on the GPU, targets, input lengths, target lengths, zero_infinity): awkward sizes (the last with
    alphabet ``large_a``), the edge cases (repeats; 5 repeats in 8 frames; an empty target; targets too long) with and
    without zero_infinity, rows not 16-byte aligned, and benchmark-sized inputs."""
    cases = [random_case(rng, T, N, A, max_target=min(T, 40), repeats=A < 10) + (False, 0)
             for T, N, A in [(1, 1, 2), (33, 7, 5), (61, 9, 37), (45, 5, 1001), (97, 3, large_a)]]
    edge = (torch.randn(8, 5, 6, generator=rng), torch.tensor([[1, 1, 2, 0, 0, 0], [3, 3, 3, 3, 3, 0], [0] * 6,
                                                              [1, 2, 3, 4, 5, 1], [2, 2, 2, 0, 0, 0]]),
            [8, 8, 5, 4, 3], [3, 5, 0, 6, 3])
    cases += [edge + (zero_infinity, 0) for zero_infinity in (False, True)]
    cases.append(random_case(rng, 20, 3, 5000, max_target=10) + (False, 1))  # rows not 16-byte aligned
    gen = torch.Generator().manual_seed(rng.seed_value)
    cases += [_benchmark_sized(gen, A) + (False, 0) for A in ctc.BENCH_A]
    for x, targets, il, tl, zero_infinity, offset in cases:
        storage = torch.empty(x.numel() + offset, device="cuda")
        xd = storage[offset:].view(x.shape)
        xd.copy_(x)
        yield x, xd, targets, il, tl, zero_infinity


@pytest.mark.gpu
def test_steps_7_to_11_give_the_same_bits_on_gpu(rng):
    """Steps 7 to 11 change where the numbers live and how the work is laid out, not the arithmetic: the emissions
    are the same floats (step 7 scales its log-softmax entry as step 8's first pass does), each position's
    log-sum-exp takes the same terms in the same order, and step 11's three-term sum with a -inf third term is the
    two-term sum. So each gives step 10's loss and gradient bit for bit, on awkward sizes, the edge cases with and
    without zero_infinity, the scalar path and benchmark-sized inputs. Step 12 (flush-to-zero) may round otherwise."""
    for x, xd, targets, il, tl, zero_infinity in _awkward_cases_on_gpu(rng, 5000):
        out = {k: _run_on_gpu(xd, targets, il, tl, k, zero_infinity) for k in range(7, 12)}
        for k in (7, 8, 9, 11):
            assert _same_bits(out[k][0], out[10][0]) and _same_bits(out[k][1], out[10][1]), (k, tuple(x.shape))


@pytest.mark.gpu
def test_step07_parts_match_the_reference_and_step_7_on_gpu(rng):
    """7a and 7b (step 7 taken apart) on fresh inputs at awkward sizes, empty targets and targets that cannot align
    (with and without zero_infinity), rows not 16-byte aligned and benchmark-sized inputs, outputs poisoned first:
    each agrees with the float64 reference and gives step 7's bits (two launches and no prefetch change where and
    when the recursion runs, not its arithmetic)."""
    for x, xd, targets, il, tl, zero_infinity in _awkward_cases_on_gpu(rng, 4999):
        seven = _run_on_gpu(xd, targets, il, tl, 7, zero_infinity)
        ref_loss, ref_grad = ctc.reference_ctc(xd, targets, il, tl, zero_infinity=zero_infinity)
        for part, function in _step07_parts_functions().items():
            loss, grad = _run_function_on_gpu(function, xd, targets, il, tl, zero_infinity)
            assert_same(loss, grad, ref_loss, ref_grad, loss_tol=ctc.LOSS_TOLERANCE, grad_tol=ctc.GRAD_TOLERANCE)
            assert _same_bits(loss, seven[0]) and _same_bits(grad, seven[1]), (part, tuple(x.shape), zero_infinity)


@pytest.mark.gpu
def test_long_targets_up_to_the_limit_on_gpu(rng):
    T, A = 1100, 40
    lists = [np.array([(j % (A - 1)) + 1 for j in range(ctc.MAX_TARGET_LENGTH)]),
             torch.randint(1, A, (300,), generator=rng).numpy()]
    x = torch.randn(T, 2, A, generator=rng)
    for step in (1, 5, *range(7, 15)):  # 1023 positions: grain 8 in step 5's block, 32 per lane in one warp
        _check_against_reference(x, ctc.padded(lists), [T, T], [len(l) for l in lists], step)
    _check_against_reference(x, ctc.padded(lists), [T, T], [len(l) for l in lists], 14, grain=2)  # 16 warps


@pytest.mark.gpu
def test_rescaling_fails_where_log_space_holds_on_gpu():
    gen = torch.Generator().manual_seed(1)
    x, lists = ctc.stress_inputs(400, 4, 28, gen, "cpu")
    targets, tl = ctc.padded(lists), [len(l) for l in lists]
    for step in (5, *range(7, 15)):
        _check_against_reference(x, targets, [400] * 4, tl, step)
    with pytest.warns(ctc.UnderflowWarning, match=r"utterance\(s\) \[0, 1, 2, 3\]"):
        loss, _ = ctc.step06_probability_space(x.cuda(), targets.cuda(), [400] * 4, tl)
    assert torch.isinf(loss).all()  # every alignment underflowed in float32 probability space


@pytest.mark.gpu
@pytest.mark.parametrize("recursion", list(ctc.fused.RECURSION_OPTIONS))
def test_recursion_options_on_gpu(recursion, rng):
    """Every option of the branch-free recursion, in both steps that use it, on awkward sizes:
    repeated labels (skips masked), up to 81 positions (several per lane), varied input lengths,
    impossible targets with zero_infinity and the vectorised first pass (A = 4000)."""
    x, targets, il, tl = random_case(rng, 70, 6, 9, max_target=40, repeats=True)
    for step in (12, 13):
        _check_against_reference(x, targets, il, tl, step, recursion=recursion)
    x, targets, il, tl = random_case(rng, 30, 3, 4000, max_target=14)
    _check_against_reference(x, targets, il, tl, 13, zero_infinity=True, recursion=recursion)


@pytest.mark.gpu
@pytest.mark.parametrize("grain", ctc.fused.BLOCK_GRAINS)
def test_block_recursion_on_gpu(grain, rng):
    """Step 14 with several warps per direction: targets long enough for 2 to 5 warps, repeated
    labels, varied input lengths (some targets too long for their input), both zero_infinity modes."""
    x, targets, il, tl = random_case(rng, 160, 6, 11, max_target=150, repeats=True)
    tl[0], il[0] = 150, 160  # 301 positions: 3 warps at 4 per thread, 5 at 2
    assert ctc.fused.recursion_warps(2 * int(tl.max()) + 1, grain) >= 3
    for zero_infinity in (False, True):
        _check_against_reference(x, targets, il, tl, 14, zero_infinity=zero_infinity, grain=grain)
    x, targets, il, tl = random_case(rng, 90, 4, 4000, max_target=80)
    _check_against_reference(x, targets, il, tl, 14, grain=grain)


@pytest.mark.gpu
def test_agrees_with_both_torch_paths_on_gpu(rng):
    gen = torch.Generator().manual_seed(rng.seed_value)
    lists = ctc.random_targets(50, 6, 29, gen)
    x = torch.randn(50, 6, 29, generator=gen).cuda()
    tl = [len(l) for l in lists]
    ours, our_grad = ctc.ctc_loss(x, ctc.padded(lists).cuda(), [50] * 6, tl)
    for targets in (ctc.peers.concatenated(lists), ctc.padded(lists).cuda()):  # cuDNN, native
        loss, grad = torch_ctc(x, targets, [50] * 6, tl)
        # torch's float32 gradient is itself only ~1e-4 accurate: this is a sanity check, the
        # strict comparison is against the float64 reference above
        torch.testing.assert_close(ours, loss, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(our_grad, grad, rtol=0, atol=1e-3)


def test_probability_space_flags_the_finite_wrong_loss_it_returns():
    """The reported defect: on long utterances (T = 1100, A = 28) float32 probability space returns a
    finite loss far from float64, no inf and no NaN in the loss. The CPU model of step 6's arithmetic
    reproduces it, and its error estimate must flag every utterance whose answer is off."""
    gen = torch.Generator().manual_seed(0)
    x, lists = ctc.report.long_inputs(1100, 6, 28, gen, "cpu")
    targets, tl = ctc.padded(lists), [len(l) for l in lists]
    ref_loss, ref_grad = ctc.reference_ctc(x, targets, [1100] * 6, tl)
    loss, grad, estimate = probability_space_ctc(x, targets, [1100] * 6, tl)
    assert loss.dtype == grad.dtype == torch.float32
    wrong = ctc.reference.wrong_utterances(loss, grad, ref_loss, ref_grad)
    finite_wrong = wrong & torch.isfinite(loss)
    assert finite_wrong.any(), "the reproduction lost its finite wrong loss"
    assert (estimate[wrong] > ctc.reference.UNDERFLOW_TOLERANCE).all(), (estimate, wrong)
    assert ctc.reference.untrusted(estimate, loss, [1100] * 6, lists).tolist() == \
        (estimate > ctc.reference.UNDERFLOW_TOLERANCE).tolist()


@pytest.mark.gpu
def test_probability_space_kernel_flags_every_answer_it_gets_wrong():
    """The defect's GPU half: step 6's kernel on the stress set (blank-heavy and long random utterances,
    T up to 1100) may be wrong, but never silently: every wrong utterance is named by its warning and
    flagged by its estimate, and the estimate agrees with the CPU model's where the model is right."""
    gen = torch.Generator().manual_seed(3)
    seen_finite_wrong = False
    for name, x, lists in ctc.report.stress_set(gen, "cpu"):
        T, N, A = x.shape
        targets, tl = ctc.padded(lists), [len(l) for l in lists]
        ref_loss, ref_grad = ctc.reference_ctc(x, targets, [T] * N, tl)
        estimate = torch.full((N,), SENTINEL, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss, grad = ctc.step06_probability_space(x.cuda(), targets.cuda(), [T] * N, tl, out_estimate=estimate)
        wrong = ctc.reference.wrong_utterances(loss, grad, ref_loss, ref_grad)
        batch = ctc.prepare_targets(targets, [T] * N, tl, num_classes=A, max_time=T, device="cuda")
        flagged = ctc.warpctc.untrusted_answers(loss, estimate, batch)
        assert not (estimate == SENTINEL).any(), name
        assert not (wrong & ~flagged).any(), (name, wrong, estimate)
        seen_finite_wrong |= bool((wrong & torch.isfinite(loss.cpu())).any())
        named = [int(i) for i in torch.nonzero(flagged).flatten()]
        messages = [str(w.message) for w in caught if issubclass(w.category, ctc.UnderflowWarning)]
        assert (len(messages) == 1 and str(named) in messages[0]) if named else not messages, (name, messages)
    assert seen_finite_wrong, "the stress set no longer holds a finite wrong answer of step 6"


@pytest.mark.gpu
def test_default_entry_point_is_never_silently_wrong_on_the_stress_set():
    """ctc_loss (the final step, log space) on every input of the chapter's stress set: the reference's
    answer within the tolerances, so no silently wrong finite loss."""
    gen = torch.Generator().manual_seed(3)
    for name, x, lists in ctc.report.stress_set(gen, "cpu"):
        T, N, A = x.shape
        targets, tl = ctc.padded(lists), [len(l) for l in lists]
        loss, grad = ctc.ctc_loss(x.cuda(), targets.cuda(), [T] * N, tl)
        ref_loss, ref_grad = ctc.reference_ctc(x.cuda(), targets, [T] * N, tl)
        assert not ctc.reference.wrong_utterances(loss, grad, ref_loss, ref_grad).any(), name
        assert ctc.errors(loss, grad, ref_loss, ref_grad)["silently_wrong"] == 0


def test_the_final_step_is_never_slower_than_any_step_on_a_measured_shape():
    """ctc_loss's rule (fused.final_step) against every committed GPU file: at each measured (T, N, A) of the grid and
    of the stress set, the step it picks for the case's longest target is within 3% of the fastest step timed there
    (the target: never slower than any step), and so is the entry point where the file times it."""
    import json

    from studylog import paths
    from studylog.ctc.fused import final_step

    files = sorted(paths.BENCH_RESULTS.glob("*/ctc.json"))
    assert files, "no committed ctc results"
    checked = 0
    for f in files:
        cases: dict = {}
        for r in json.loads(f.read_text())["measurements"]:
            p, series = r["params"], r["series"].removeprefix("stress ")
            if r.get("clock") != "gpu" or set(p) - {"inputs"} != {"T", "N", "A"}:
                continue
            if series.startswith("step") and " " not in series or series == "ctc_loss":
                case = cases.setdefault((p["T"], p["N"], p["A"], p.get("inputs")), {"ms": {}, "spread": {}})
                case["ms"][series] = r["ms"]
                case["spread"][series] = r["spread_ms"]
                case["positions"] = r.get("max_positions") or case.get("positions")
        for (T, N, A, inputs), case in cases.items():
            ms, spread = case["ms"], case["spread"]
            entry = ms.pop("ctc_loss", None)
            if case.get("positions") is None or not {"step12", "step13", "step14"} <= set(ms):
                continue
            picked = f"step{final_step(T, N, A, case['positions']):02d}"
            where = (f.parent.name, T, N, A, inputs, picked, ms)
            assert ms[picked] <= 1.03 * min(ms.values()), where
            # the entry point, timed in a row of its own: within 3% of the fastest step, spreads included (the
            # stress set replays each call a few times only, so one kernel's two rows can differ by more than 3%)
            fastest = min(ms, key=ms.get)
            assert entry is None or min(spread["ctc_loss"]) <= 1.03 * max(spread[fastest]), (entry, *where)
            checked += 1
    assert checked >= 16
