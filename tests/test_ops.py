"""The chapters' entry points as PyTorch operators (``torch.ops.studylog.*``, each chapter's ``ops`` module).

On any machine: ``torch.library.opcheck`` for every operator that runs here (the Triton ones in the
interpreter at small sizes, n-gram matching through step 1's C loop, the CTC loss through the float64
reference), the fake (meta) implementations' shapes and dtypes for every operator (also those whose kernels
cannot run on a CPU), ``gradcheck`` of the differentiable CTC loss in float64, and ``torch.compile(fullgraph=True)``
over the Triton operators in the interpreter, where tracing the Python entry point stops with
``KeyError(torch.uint64)``. On a GPU (``gpu``): every operator under ``torch.compile(fullgraph=True)`` with no
graph break, captured in a CUDA graph and replayed over new inputs, and checked against its reference.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from studylog import ctc, masked_lm_head as mlh, multi_item as mi, ngram, runtime, ternary as T

sys.path.insert(0, str(Path(__file__).parent))
from ngram_helpers import op_arguments  # noqa: E402
from ternary_helpers import ternary  # noqa: E402

DEV = runtime.device()
GPU = runtime.mode() == "gpu"
OPS = {"masked_logits": mlh.ops.masked_logits, "ngram_match": ngram.ops.ngram_match, "ctc_loss": ctc.ops.ctc_loss,
       "ternary_matmul": T.ops.ternary_matmul, "multi_item_attention": mi.ops.multi_item_attention}
TRITON_FORMATS = ("2bit", "base3", "2bit_mma")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- inputs of each operator ------------------------------------------------------------------------------

def masked_inputs(batch: int, vocab: int, hidden: int, allowed_per_seq: int, seed: int):
    """(h, weight, AllowedTokens): ``allowed_per_seq`` random ids per sequence (all of them when it is ``vocab``)."""
    g = gen(seed)
    h = torch.randn(batch, hidden, generator=g).to(DEV, torch.bfloat16)
    weight = torch.randn(vocab, hidden, generator=g).to(DEV, torch.bfloat16)
    ids = [torch.randperm(vocab, generator=g)[:allowed_per_seq] for _ in range(batch)]
    return h, weight, mlh.AllowedTokens.from_ids(ids, vocab, device=DEV)


def ngram_args(batch: int, prompt_width: int, gen_width: int, seed: int, config=ngram.NgramConfig()) -> tuple:
    inputs, draft, this_time = ngram.make_batch(batch, prompt_width, gen_width, seed=seed, hybrid=config.hybrid,
                                                device=DEV)
    return op_arguments(inputs, draft, this_time, config)


def ctc_inputs(T_: int, N: int, A: int, seed: int, device=DEV, dtype=torch.float32):
    """(activations, CTCTargets): random targets that fit (some repeated labels), random input lengths."""
    g = gen(seed)
    x = torch.randn(T_, N, A, generator=g, dtype=torch.float64).to(device, dtype)
    lists = ctc.random_targets(T_, N, A, g, max_length=max(1, T_ // 3))
    lists[0][1:2] = lists[0][:1]  # a repeated label: the recursion's skip rule
    inputs = [T_] + [int(torch.randint(max(ctc.min_frames(l), 1), T_ + 1, (1,), generator=g)) for l in lists[1:]]
    targets = ctc.prepare_targets(ctc.padded(lists), inputs, [len(l) for l in lists], num_classes=A, max_time=T_,
                                  device=device)
    return x, targets


def ternary_args(fmt: str, m: int | None, n: int, k: int, seed: int):
    """(op arguments, dense int8 W, x): ``m=None`` gives a vector x."""
    g = gen(seed)
    w = ternary(n, k, g).to(DEV)
    packed = T.PackedTernary.pack(w, fmt)
    x = torch.randn(*((k,) if m is None else (m, k)), generator=g).to(DEV)
    if fmt in ("2bit_mma", "2bit_tiles"):
        x = x.to(torch.bfloat16)
    return (x, packed.data, packed.n, packed.k, packed.fmt, 1.7), w, x


def multi_item_inputs(prefix_lens, item_lens, heads: int, head_dim: int, dtype, seed: int, rule=mi.DEFAULT_RULE):
    """(op arguments, batch)."""
    batch = mi.MultiItemBatch.from_item_lens(prefix_lens, item_lens, device=DEV)
    g = gen(seed)
    q, k, v = (torch.randn(heads, batch.total_tokens, head_dim, generator=g).to(DEV, dtype) for _ in range(3))
    schedule, token_pos, programs = mi.ops.layout(batch, q, rule)
    return (q, k, v, schedule, token_pos, programs, None, rule), batch


SMALL_MI = ([37, 0], [[5, 13, 2], [4, 3]])
MI_DTYPE = torch.float16 if GPU else torch.float32


# -- the operators and their schemas ------------------------------------------------------------------------

SCHEMAS = {
    "masked_logits": ["h", "weight", "bitmask", "max_allowed"],
    "ngram_match": ["prompt_ids", "prompt_lens", "generated_ids", "step_idx", "draft_token_num", "max_dec_len",
                    "seq_lens_encoder", "seq_lens_decoder", "draft_tokens", "seq_lens_this_time", "max_ngram_size",
                    "min_ngram_size", "threshold", "hybrid", "max_draft_tokens"],
    "ctc_loss": ["activations", "labels", "input_lengths", "target_lengths", "slot_class", "slot_start",
                 "slot_members", "num_slots", "zero_infinity"],
    "ternary_matmul": ["x", "packed", "n", "k", "fmt", "scale", "scale_tensor"],
    "multi_item_attention": ["q", "k", "v", "schedule", "token_pos", "programs", "sm_scale", "rule"],
}
RETURNS = {"masked_logits": 1, "ngram_match": 0, "ctc_loss": 2, "ternary_matmul": 1, "multi_item_attention": 1}


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_entry_point_is_a_studylog_operator(name):
    """Registered as ``torch.ops.studylog.<name>`` with tensors for what the Python entry point takes as objects;
    only n-gram matching mutates (its state, in place, as the deployed operator did); each has a docstring."""
    schema = getattr(torch.ops.studylog, name).default._schema
    assert [a.name for a in schema.arguments] == SCHEMAS[name]
    assert len(schema.returns) == RETURNS[name]
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutated == (["draft_tokens", "seq_lens_this_time"] if name == "ngram_match" else [])
    assert OPS[name].__doc__ and "\n" not in OPS[name].__doc__.strip()


# -- masked LM head ---------------------------------------------------------------------------------------

#: (batch, vocab, hidden, allowed per sequence, max_allowed or None for the union's count, path, summation)
MASKED_CASES = {
    "stream": (1, 300, 48, 40, None, "stream", "row"),
    "batched": (3, 200, 32, 2, None, "batched", "dot"),
    "row_skip": (3, 200, 32, 2, -1, "row_skip", "dot"),
    "dense": (2, 150, 32, 3, -1, "dense", "dot"),
}


def _dense_rule(monkeypatch):
    """Send every union to the cuBLAS dense path (the committed rule takes it only from batch 256 on)."""
    rule = mlh.DispatchRule({1: 0.0, 2: 0.0}, {1: "cublas", 2: "cublas"}, 0, "tests: the dense path")
    monkeypatch.setattr(mlh.ops, "dispatch_rule", lambda: rule)


def _masked_case(case, monkeypatch):
    batch, vocab, hidden, per_seq, bound, path, summation = MASKED_CASES[case]
    if path == "dense":
        _dense_rule(monkeypatch)
    h, weight, allowed = masked_inputs(batch, vocab, hidden, per_seq, seed=len(case))
    bound = allowed.union_count if bound is None else bound
    assert mlh.ops.bucket_of_bound(batch, vocab, bound)[0] == path
    return (h, weight, allowed.bitmask, bound), allowed, summation


@pytest.mark.parametrize("case", sorted(MASKED_CASES))
def test_masked_logits_operator(case, monkeypatch):
    """Each of step 9's paths from the bitmask: the logits within the fp32 bound of the float64 reference,
    ``-inf`` elsewhere, and ``opcheck`` passes."""
    args, allowed, summation = _masked_case(case, monkeypatch)
    out = mlh.ops.masked_logits(*args)
    assert mlh.check_logits(out, args[0], args[1], allowed, summation=summation)["passed"]
    torch.library.opcheck(mlh.ops.masked_logits, args)


@pytest.mark.skipif(GPU, reason="the interpreter's failure: on a GPU Triton compiles the kernels")
def test_masked_logits_compiles_in_the_interpreter():
    """``torch.compile(fullgraph=True)`` over the operator in Triton's interpreter: Dynamo does not enter the
    interpreter (whose numpy pointer arithmetic in uint64 it cannot turn into tensors: ``KeyError(torch.uint64)``
    when it traces the Python entry point)."""
    h, weight, allowed = masked_inputs(1, 200, 32, 9, seed=1)
    bitmask, count = allowed.bitmask, allowed.union_count  # (outside: Python 3.11's cached_property takes a lock)
    compiled = torch.compile(lambda h, w: mlh.ops.masked_logits(h, w, bitmask, count), fullgraph=True,
                             backend="aot_eager")
    out = compiled(h, weight)
    assert mlh.check_logits(out, h, weight, allowed, summation="row")["passed"]
    torch.testing.assert_close(out, mlh.ops.masked_logits(h, weight, bitmask, count))


def test_masked_logits_checks_its_arguments():
    h, weight, allowed = masked_inputs(2, 100, 16, 3, seed=0)
    with pytest.raises(ValueError, match="bitmask must be"):
        mlh.ops.masked_logits(h, weight, allowed.bitmask[:1], -1)
    with pytest.raises(TypeError, match="weight must be"):
        mlh.ops.masked_logits(h, weight.half(), allowed.bitmask, -1)
    with pytest.raises(ValueError, match="max_allowed"):
        mlh.ops.masked_logits(h, weight, allowed.bitmask, -2)


# -- n-gram matching --------------------------------------------------------------------------------------

@pytest.mark.parametrize("hybrid", [False, True], ids=["ngram", "hybrid"])
def test_ngram_match_operator(hybrid):
    """The state the specification gives, bit for bit (step 7 on CUDA, step 1's C loop on the CPU), and
    ``opcheck`` passes (the operator mutates ``draft_tokens`` and ``seq_lens_this_time``)."""
    config = ngram.NgramConfig.hybrid_variant() if hybrid else ngram.NgramConfig()
    args = ngram_args(6, 40, 12, seed=3 + hybrid, config=config)
    inputs, draft, this_time = ngram.NgramInputs(*args[:8]), args[8], args[9]
    want = ngram.reference_ngram_match(inputs, draft, this_time, config)
    ngram.ops.ngram_match(*args)
    assert ngram.same_state((draft, this_time), want)
    torch.library.opcheck(ngram.ops.ngram_match, ngram_args(6, 40, 12, seed=5, config=config))


def test_ngram_match_compiles():
    """``torch.compile(fullgraph=True)`` (Dynamo and AOT functionalisation of the in-place state) gives the
    state of an eager call."""
    args = ngram_args(5, 30, 9, seed=7)
    eager = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in args)
    ngram.ops.ngram_match(*eager)
    torch.compile(lambda *a: ngram.ops.ngram_match(*a), fullgraph=True, backend="aot_eager")(*args)
    assert ngram.same_state(args[8:10], eager[8:10])


# -- CTC loss ---------------------------------------------------------------------------------------------

def test_ctc_loss_operator_opcheck():
    """``opcheck`` with activations that require grad (the autograd registration, the fake implementation,
    AOT dispatch with dynamic shapes): the kernels on CUDA, the float64 reference on the CPU."""
    x, targets = ctc_inputs(12, 3, 6, seed=0)
    torch.library.opcheck(ctc.ops.ctc_loss, (x.requires_grad_(), *ctc.ops.target_tensors(targets)))


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_gradcheck(zero_infinity):
    """``gradcheck`` in float64 on the CPU (the reference path): the backward, the saved gradient scaled by
    each utterance's incoming gradient, agrees with finite differences of the loss."""
    x, targets = ctc_inputs(5, 3, 4, seed=1, device="cpu", dtype=torch.float64)
    args = ctc.ops.target_tensors(targets)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: ctc.ops.ctc_loss(x, *args, zero_infinity)[0], (x,))


def test_ctc_loss_backward_matches_torch():
    """``loss`` differentiable through autograd: the gradient of a weighted sum of the losses is torch's own
    (``F.ctc_loss`` and autograd), and the returned gradient is not differentiable."""
    x, targets = ctc_inputs(9, 4, 5, seed=2, device="cpu", dtype=torch.float64)
    x.requires_grad_(True)
    loss, grad = ctc.ops.ctc_loss(x, *ctc.ops.target_tensors(targets))
    assert not grad.requires_grad
    weights = torch.randn(4, generator=gen(0), dtype=torch.float64)
    (loss * weights).sum().backward()
    lists = targets.label_lists
    x_t = x.detach().requires_grad_(True)
    want = torch.nn.functional.ctc_loss(x_t.log_softmax(2), ctc.padded(lists), targets.input_lengths_host,
                                        targets.target_lengths_host, reduction="none")
    (want * weights).sum().backward()
    torch.testing.assert_close(loss.detach(), want.detach())
    torch.testing.assert_close(x.grad, x_t.grad)


def test_ctc_loss_infeasible_target_with_zero_infinity():
    """A target longer than its input: an infinite loss (and NaN gradient over its frames), or 0 and 0 with
    ``zero_infinity``, as the Python entry point and torch."""
    T_, A = 4, 5
    x = torch.randn(T_, 2, A, generator=gen(3)).to(DEV)
    targets = ctc.prepare_targets(torch.tensor([[1, 2, 3, 4, 1], [2, 0, 0, 0, 0]]), [T_, T_], [5, 1],
                                  num_classes=A, max_time=T_, device=DEV)
    loss, grad = ctc.ops.ctc_loss(x, *ctc.ops.target_tensors(targets))
    assert torch.isinf(loss[0]) and torch.isfinite(loss[1])
    loss, grad = ctc.ops.ctc_loss(x, *ctc.ops.target_tensors(targets), True)
    assert loss[0] == 0 and bool((grad[:, 0] == 0).all())


def test_ctc_loss_compiles_with_its_backward():
    """``torch.compile(fullgraph=True)`` over the loss and its backward (AOT autograd over the registered
    formula) gives eager's gradient."""
    x, targets = ctc_inputs(8, 2, 5, seed=4)
    args = ctc.ops.target_tensors(targets)
    compiled = torch.compile(lambda x: ctc.ops.ctc_loss(x, *args)[0].sum(), fullgraph=True, backend="aot_eager")
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(x1).backward()
    ctc.ops.ctc_loss(x2, *args)[0].sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-6, atol=1e-7)


# -- ternary matmul ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("vector", [True, False], ids=["vector", "matrix"])
@pytest.mark.parametrize("fmt", TRITON_FORMATS + (("2bit_tiles",) if GPU else ()))
def test_ternary_matmul_operator(fmt, vector):
    """Each format's step (Triton in the interpreter on the CPU; steps 10 and 11 for ``2bit_tiles`` on a GPU)
    within the chapter's tolerance, with a number and with per-channel scales, and ``opcheck`` passes."""
    args, w, x = ternary_args(fmt, None if vector else 3, 40, 96, seed=5)
    z = T.ops.ternary_matmul(*args)
    assert z.shape == ((40,) if vector else (3, 40)) and z.dtype == torch.float32
    assert T.error_ratio(z, x, w, args[5]) <= T.FP32_TOLERANCE
    scales = (torch.rand(40, generator=gen(1)) + 0.5).to(DEV)
    assert T.error_ratio(T.ops.ternary_matmul(*args[:5], 1.0, scales), x, w, scales) <= T.FP32_TOLERANCE
    torch.library.opcheck(T.ops.ternary_matmul, args)


@pytest.mark.skipif(GPU, reason="on a GPU the 2bit_tiles kernels run, and test_ternary_matmul_operator opchecks them")
def test_ternary_matmul_2bit_tiles_cannot_run_on_the_cpu():
    """Steps 10 and 11 are CUDA C++: on the CPU the operator says so (its fake implementation still runs,
    test_fake_implementations); ``opcheck`` executes the operator, so it is not run for this format here."""
    args, _, _ = ternary_args("2bit_tiles", 2, 40, 96, seed=0)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        T.ops.ternary_matmul(*args)


@pytest.mark.skipif(GPU, reason="the interpreter's compile test; the GPU tests compile every operator")
def test_ternary_matmul_compiles_in_the_interpreter():
    args, _, _ = ternary_args("2bit", 2, 40, 96, seed=6)
    compiled = torch.compile(lambda x: T.ops.ternary_matmul(x, *args[1:]), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(args[0]), T.ops.ternary_matmul(*args), rtol=0, atol=0)


# -- multi-item attention ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", mi.RULES)
def test_multi_item_attention_operator(rule):
    """The final kernel over a batch of two prompts (one without a prefix) against the float64 reference, on
    ``[heads, tokens, head_dim]`` tensors and on a transposed ``[tokens, heads, head_dim]`` one, and
    ``opcheck`` passes."""
    args, batch = multi_item_inputs(*SMALL_MI, heads=2, head_dim=16, dtype=MI_DTYPE, seed=7, rule=rule)
    tol = 2e-3 if MI_DTYPE == torch.float16 else 1e-5
    out = mi.ops.multi_item_attention(*args)
    q, k, v = args[:3]
    torch.testing.assert_close(out.double(), mi.reference_attention(q, k, v, batch, rule=rule), rtol=tol, atol=tol)
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    out = mi.ops.multi_item_attention(qt, *args[1:6], 0.3, rule)
    assert out.stride() == qt.stride()
    torch.testing.assert_close(out.double(), mi.reference_attention(q, k, v, batch, 0.3, rule), rtol=tol, atol=tol)
    torch.library.opcheck(mi.ops.multi_item_attention, args)


def test_multi_item_attention_needs_its_layout():
    args, _ = multi_item_inputs(*SMALL_MI, heads=2, head_dim=16, dtype=MI_DTYPE, seed=0)
    with pytest.raises(ValueError, match="no programs for tile heights"):
        mi.ops.multi_item_attention(*args[:5], [0, 0, 0, 0])
    with pytest.raises(ValueError, match="head_dim"):
        mi.ops.multi_item_attention(*(t[..., :8] for t in args[:3]), *args[3:])


@pytest.mark.skipif(GPU, reason="the interpreter's compile test; the GPU tests compile every operator")
def test_multi_item_attention_compiles_in_the_interpreter():
    args, _ = multi_item_inputs(*SMALL_MI, heads=2, head_dim=16, dtype=MI_DTYPE, seed=8)
    compiled = torch.compile(lambda q, k, v: mi.ops.multi_item_attention(q, k, v, *args[3:]), fullgraph=True,
                             backend="aot_eager")
    torch.testing.assert_close(compiled(*args[:3]), mi.ops.multi_item_attention(*args), rtol=0, atol=0)


# -- the fake implementations, for every operator -----------------------------------------------------------

def _fake_cases():
    """(name, operator, arguments, the outputs' (shape, dtype)s): every operator, including the formats and
    paths whose kernels do not run on this machine."""
    h, weight, allowed = masked_inputs(3, 200, 32, 5, seed=0)
    yield "masked_logits", mlh.ops.masked_logits, (h, weight, allowed.bitmask, -1), [((3, 200), torch.float32)]
    args = ngram_args(4, 20, 8, seed=0)
    yield "ngram_match", ngram.ops.ngram_match, args, []
    x, targets = ctc_inputs(7, 3, 5, seed=0)
    yield "ctc_loss", ctc.ops.ctc_loss, (x, *ctc.ops.target_tensors(targets)), [((3,), x.dtype), ((7, 3, 5), x.dtype)]
    for fmt in TRITON_FORMATS + ("2bit_tiles",):
        for m in (None, 5):
            args, _, _ = ternary_args(fmt, m, 40, 96, seed=0)
            shape = (40,) if m is None else (5, 40)
            yield f"ternary_matmul[{fmt}, m={m}]", T.ops.ternary_matmul, args, [(shape, torch.float32)]
    args, batch = multi_item_inputs(*SMALL_MI, heads=3, head_dim=32, dtype=MI_DTYPE, seed=0)
    yield "multi_item_attention", mi.ops.multi_item_attention, args, [((3, batch.total_tokens, 32), MI_DTYPE)]


FAKE_CASES = {name: (op, args, want) for name, op, args, want in _fake_cases()}


@pytest.mark.parametrize("name", sorted(FAKE_CASES))
def test_fake_implementations(name):
    """Each operator's fake (meta) implementation gives its outputs' shapes and dtypes from fake inputs, with no
    data and no kernel, as ``torch.compile`` sees them (also where the kernels cannot run here: ``2bit_tiles``
    on the CPU)."""
    op, args, want = FAKE_CASES[name]
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = op(*fake_args)
    outs = [] if out is None else list(out) if isinstance(out, tuple) else [out]
    assert [(tuple(o.shape), o.dtype) for o in outs] == want
    assert all(o.device == DEV or o.device.type == DEV.type for o in outs)


# -- on a GPU: torch.compile without a graph break, CUDA graphs -----------------------------------------------

@dataclass
class GpuCase:
    """An operator call ``fn(*inputs)`` (outputs: a tensor or a tuple of them) and ``inputs(seed)``, new values
    of the same shapes; ``check(inputs, outputs)`` against the chapter's reference."""

    fn: Callable
    inputs: Callable[[int], list]
    check: Callable
    tol: float = 1e-5


def _outputs(out) -> list:
    return [out] if isinstance(out, torch.Tensor) else list(out)


def _gpu_masked(batch: int, vocab: int, hidden: int, per_seq: int) -> GpuCase:
    _, weight, _ = masked_inputs(batch, vocab, hidden, per_seq, seed=0)
    bound = min(vocab, batch * per_seq)

    def inputs(seed):
        h, _, allowed = masked_inputs(batch, vocab, hidden, per_seq, seed)
        return [h, allowed.bitmask]

    def check(inp, out):
        allowed = mlh.AllowedTokens.from_bitmask(inp[1], vocab)
        assert mlh.check_logits(out, inp[0], weight, allowed)["passed"]

    return GpuCase(lambda h, bitmask: mlh.ops.masked_logits(h, weight, bitmask, bound), inputs, check)


def _gpu_ngram(batch: int = 16, prompt_width: int = 700, gen_width: int = 90) -> GpuCase:
    def check(inp, out):
        inputs, draft, this_time = ngram.NgramInputs(*inp[:8]), inp[8], inp[9]
        assert ngram.same_state(out, ngram.reference_ngram_match(inputs, draft, this_time))

    def fn(*args):
        ngram.ops.ngram_match(*args)
        return args[8], args[9]

    # (check runs on the inputs after the call: the reference is given the state before it, saved in inputs)
    return GpuCase(fn, lambda seed: list(ngram_args(batch, prompt_width, gen_width, seed=seed)[:10]), check, 0.0)


def _gpu_ctc(T_: int = 60, N: int = 5, A: int = 29) -> GpuCase:
    _, targets = ctc_inputs(T_, N, A, seed=0)
    args = ctc.ops.target_tensors(targets)

    def check(inp, out):
        ref_loss, ref_grad = ctc.reference_ctc(inp[0].cpu(), ctc.padded(list(targets.label_lists)),
                                               targets.input_lengths_host, targets.target_lengths_host)
        err = ctc.errors(out[0], out[1].cpu(), ref_loss, ref_grad)
        assert err["mismatched"] == 0 and err["loss_rel"] <= ctc.LOSS_TOLERANCE
        assert err["grad_rel"] <= ctc.GRAD_TOLERANCE, err

    return GpuCase(lambda x: ctc.ops.ctc_loss(x, *args), lambda seed: [ctc_inputs(T_, N, A, seed)[0]], check)


def _gpu_ternary(fmt: str, m: int | None, n: int = 1024, k: int = 2048) -> GpuCase:
    args, w, _ = ternary_args(fmt, m, n, k, seed=0)

    def check(inp, out):
        assert T.error_ratio(out, inp[0], w, args[5]) <= T.FP32_TOLERANCE

    return GpuCase(lambda x: T.ops.ternary_matmul(x, *args[1:]),
                   lambda seed: [ternary_args(fmt, m, n, k, seed)[2]], check)


def _gpu_multi_item(shape=([300, 0, 70], [[20, 33, 7, 64], [9, 12], [5] * 20]), heads: int = 4, head_dim: int = 64,
                    dtype=torch.float16) -> GpuCase:
    args, batch = multi_item_inputs(*shape, heads=heads, head_dim=head_dim, dtype=dtype, seed=0)
    tol = 2e-3 if dtype == torch.float16 else 1e-5

    def check(inp, out):
        torch.testing.assert_close(out.double(), mi.reference_attention(*inp, batch), rtol=tol, atol=tol)

    return GpuCase(lambda q, k, v: mi.ops.multi_item_attention(q, k, v, *args[3:]),
                   lambda seed: list(multi_item_inputs(*shape, heads, head_dim, dtype, seed)[0][:3]), check, tol)


GPU_CASES = {
    "masked_logits[batch 1]": lambda: _gpu_masked(1, 32000, 1024, 500),
    "masked_logits[batch 8]": lambda: _gpu_masked(8, 32000, 1024, 100),
    "masked_logits[row_skip]": lambda: _gpu_masked(8, 4096, 512, 4096),
    "ngram_match": _gpu_ngram,
    "ctc_loss": _gpu_ctc,
    "ternary_matmul[2bit_tiles, m=1]": lambda: _gpu_ternary("2bit_tiles", 1),
    "ternary_matmul[2bit_tiles, m=16]": lambda: _gpu_ternary("2bit_tiles", 16),
    "ternary_matmul[2bit, vector]": lambda: _gpu_ternary("2bit", None),
    "ternary_matmul[2bit_mma, m=4]": lambda: _gpu_ternary("2bit_mma", 4),
    "multi_item_attention": _gpu_multi_item,
}


def _clone(inputs: list) -> list:
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]


def _assert_same(got, want, tol: float) -> None:
    for g, w in zip(_outputs(got), _outputs(want), strict=True):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_gpu_operator_matches_its_reference(name):
    case = GPU_CASES[name]()
    inputs = case.inputs(1)
    out = case.fn(*_clone(inputs))
    case.check(inputs, out)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_gpu_compile_fullgraph_without_graph_break(name):
    """Dynamo traces the call into one graph (``explain``: no graph break), and ``torch.compile(fullgraph=True)``
    (Inductor) gives eager's outputs."""
    case = GPU_CASES[name]()
    explained = torch._dynamo.explain(case.fn)(*_clone(case.inputs(1)))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(case.fn, fullgraph=True)
    for seed in (2, 3):
        inputs = case.inputs(seed)
        _assert_same(compiled(*_clone(inputs)), case.fn(*_clone(inputs)), case.tol)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_gpu_cuda_graph_capture_and_replay(name):
    """Captured once in a CUDA graph (after an eager warm-up that compiles and autotunes), replayed over new
    values written into the same input tensors: eager's outputs on those values."""
    case = GPU_CASES[name]()
    static = case.inputs(4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        case.fn(*_clone(static))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = case.fn(*static)
    for seed in (5, 6):
        fresh = case.inputs(seed)
        for s, f in zip(static, fresh):
            if isinstance(s, torch.Tensor):
                s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        _assert_same(out, case.fn(*_clone(fresh)), case.tol)


@pytest.mark.gpu
def test_gpu_ctc_loss_backward_is_the_kernels_gradient():
    """On the GPU the backward of the loss (compiled, with Inductor) is the kernels' gradient, scaled per
    utterance, and within the chapter's tolerance of the float64 reference's."""
    x, targets = ctc_inputs(80, 6, 40, seed=9)
    args = ctc.ops.target_tensors(targets)
    weights = torch.rand(6, generator=gen(2)).to(DEV) + 0.5
    compiled = torch.compile(lambda x: (ctc.ops.ctc_loss(x, *args)[0] * weights).sum(), fullgraph=True)
    x1 = x.clone().requires_grad_()
    compiled(x1).backward()
    _, grad = ctc.ops.ctc_loss(x, *args)
    torch.testing.assert_close(x1.grad, grad * weights[None, :, None], rtol=1e-6, atol=1e-7)
    ref_loss, ref_grad = ctc.reference_ctc(x.cpu(), ctc.padded(list(targets.label_lists)),
                                           targets.input_lengths_host, targets.target_lengths_host)
    err = ctc.errors(ctc.ops.ctc_loss(x, *args)[0], x1.grad.cpu() / weights.cpu()[None, :, None], ref_loss, ref_grad)
    assert err["mismatched"] == 0 and err["grad_rel"] <= ctc.GRAD_TOLERANCE, err


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["dense", "row_skip", "batched", "stream"])
def test_gpu_masked_logits_paths(path, monkeypatch):
    """Every path of the operator on the GPU at a moderate size (the dense one through torch's fp32-output
    matmul and the bitmask kernel), against the float64 reference."""
    if path == "dense":
        _dense_rule(monkeypatch)
    batch = 1 if path == "stream" else 4
    per_seq = {"dense": 300, "row_skip": 9000, "batched": 50, "stream": 2000}[path]
    h, weight, allowed = masked_inputs(batch, 20000, 768, per_seq, seed=11)
    bound = -1 if path in ("dense", "row_skip") else allowed.union_count
    assert mlh.ops.bucket_of_bound(batch, 20000, bound)[0] == path
    out = mlh.ops.masked_logits(h, weight, allowed.bitmask, bound)
    assert mlh.check_logits(out, h, weight, allowed)["passed"]
