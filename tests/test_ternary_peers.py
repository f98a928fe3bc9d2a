"""Chapter 5's peers (studylog/ternary/peers.py) on the CPU: GemLite holds our ternary weights exactly and its
M = 1 kernel (its GEMV, in Triton's interpreter) gives our product within bf16 rounding; the torch._int_mm path
computes the W2A8 product exactly as steps 22 to 25 define it; and the benchmark's bookkeeping around them."""

import contextlib
import importlib.util
import types
from unittest import mock

import pytest
import torch

from studylog import runtime
from studylog import ternary as T
from studylog.ternary import peers as P

DEV = runtime.device()
HAS_GEMLITE = importlib.util.find_spec("gemlite") is not None


def ternary(n, k, rng, zeros=1 / 3):
    u = torch.rand(n, k, generator=rng)
    sign = torch.where(torch.rand(n, k, generator=rng) < 0.5, -1, 1)
    return torch.where(u < zeros, 0, sign).to(torch.int8)


@pytest.fixture(scope="module")
def gemlite():
    """GemLite, loaded. Without a GPU it queries the device as it loads and when it prunes its configs: those
    queries get an H100-like answer, its autotuning is set to its one default config per kernel (the
    interpreter cannot time), and its bf16 atomics go through float32 (the interpreter has no bf16 atomics)."""
    if not HAS_GEMLITE:
        pytest.skip("gemlite is not installed (an optional peer: pip install gemlite)")
    if runtime.has_gpu():
        yield P.import_gemlite()
        return
    import triton

    props = types.SimpleNamespace(name="cpu (no GPU)", multi_processor_count=132, major=9, minor=0)
    driver = types.SimpleNamespace(
        get_current_target=lambda: types.SimpleNamespace(backend="cuda", arch=90, warp_size=32),
        utils=types.SimpleNamespace(get_device_properties=lambda index: {"max_shared_mem": 232448}),
        get_benchmarker=lambda: (lambda fn, quantiles=None, **kw: [1.0, 1.0, 1.0]))
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch("torch.cuda.get_device_properties", return_value=props))
        stack.enter_context(mock.patch("torch.cuda.get_device_capability", return_value=(9, 0)))
        stack.enter_context(mock.patch.object(type(triton.runtime.driver), "active", new=driver))
        module = P.import_gemlite()
        module.set_autotune("default")
        module.set_native_atomic_bfp16(False)
        yield module


def test_gemlite_holds_our_ternary_weights_exactly(gemlite, rng):
    """Codes w + 1, zero point 1, scale 1 / scale: decoded from GemLite's own packed words, the weights are ours
    bit for bit (GemLite packs on the device it is given: its Triton packer on a GPU, torch on the CPU)."""
    n, k, scale = 37, 544, 1.7
    w = ternary(n, k, rng)
    layer = P.gemlite_ternary(w.to(DEV), scale)
    decoded, scales, zeros = P.gemlite_weights(layer)
    assert torch.equal(decoded.cpu(), w)
    assert torch.equal(scales.cpu(), torch.full((n,), 1 / scale, dtype=torch.float32))
    assert zeros.numel() == 1 and int(zeros) == 1
    with pytest.raises(ValueError, match="must be ternary"):
        P.gemlite_ternary(torch.full((32, 64), 2, dtype=torch.int8, device=DEV), scale)
    with pytest.raises(ValueError, match="finite nonzero"):
        P.gemlite_ternary(w.to(DEV), 0.0)


@pytest.mark.parametrize("m", [1, 3])
def test_gemlite_gemv_gives_our_product_within_bf16_rounding(gemlite, m, rng):
    """GemLite's kernel for a few rows of x (its GEMV, split in two along K), on the CPU in Triton's
    interpreter: the float64 product x @ w.T / scale within bf16 rounding; one flipped weight row is not."""
    n, k, scale = 37, 544, 1.7
    w = ternary(n, k, rng)
    x = torch.randn(m, k, generator=rng).to(DEV, torch.bfloat16)
    layer = P.gemlite_ternary(w.to(DEV), scale)
    if not runtime.has_gpu():
        assert P.gemlite_matmul_type(m) == "GEMV_REVSPLITK"
    z = layer(x)
    assert z.dtype == torch.bfloat16 and z.shape == (m, n)
    ref = T.reference(x, w.to(DEV), scale)
    assert P.relative_norm_error(z, ref) <= P.BF16_NORM_TOLERANCE
    wrong = w.clone()
    row = int(ref.abs().amax(0).argmax())  # the largest output: flipping its row moves the norm by >= 2/sqrt(n)
    wrong[row] = -wrong[row]
    assert P.relative_norm_error(P.gemlite_ternary(wrong.to(DEV), scale)(x), ref) > P.BF16_NORM_TOLERANCE


def test_int_mm_rows_and_plan_refusals():
    assert [P.int_mm_rows(m) for m in (1, 16, 17, 128)] == [17, 17, 17, 128]
    with pytest.raises(ValueError, match="positive int"):
        P.int_mm_rows(0)
    with pytest.raises(ValueError, match="multiples of 8"):
        P.IntMMPlan(torch.zeros(24, 36, dtype=torch.int8, device=DEV), 1.0, 1)
    with pytest.raises(TypeError, match="int8"):
        P.IntMMPlan(torch.zeros(24, 32, device=DEV), 1.0, 1)


@pytest.mark.parametrize("m", [1, 5, 20])
def test_int_mm_plan_computes_the_w2a8_product(m, rng):
    """The padded torch._int_mm path: exact int32 sums of the quantised x (the bits quantize_activations gives,
    as steps 22 to 25 use), divided in float32; the padding rows stay zero call after call."""
    n, k, scale = 40, 264, 0.8
    w = ternary(n, k, rng).to(DEV)
    plan = P.IntMMPlan(w, scale, m)
    assert plan.xq.shape == (max(m, 17), k)
    for _ in range(2):
        x = torch.randn(m, k, generator=rng).to(DEV, torch.bfloat16)
        z = plan(x)
        xq, x_scale = T.quantize_activations(x)
        ref_q = (xq.double() @ w.double().T) / (x_scale.double()[:, None] * scale)
        magnitude = (xq.double().abs() @ w.double().abs().T) / (x_scale.double()[:, None] * scale)
        assert z.dtype == torch.float32 and z.shape == (m, n)
        assert T.formats.error_ratio_from(z, ref_q, magnitude) <= T.FP32_TOLERANCE
        assert not plan.xq[m:].any()
        acc = plan.matmul()
        assert torch.equal(acc[:m], xq.int() @ w.int().T) and not acc[m:].any()
