"""Chapter 5, ternary matmul: formats, the Triton steps (1 to 14), bad input (steps 15 to 25, CUDA C++, and the
chapter's results: test_ternary_cuda.py; the first attempt's bugs: lab/ternary/first_attempt.py).

In the interpreter the kernels run at small, awkward sizes: K and N are not multiples of the
blocks, of the 16 weights of a word, of the 256 of a 2-bit group or of the 80 of a base-3 group.
Every config each kernel can be autotuned to is run explicitly. The same checks run at full
size on a GPU (``-m gpu``).
"""

import math

import pytest
import torch

from studylog import runtime
from studylog import ternary as T
from studylog.ternary import formats as F

from ternary_helpers import (DEV, TOL, assert_matches, poisoned, ternary, unpack, unpack_data,  # noqa: F401
                             weights_for, x_for)


# ------------------------------------------------------------------------------------------------
# Formats
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, k", [(1, 1), (3, 15), (2, 16), (5, 17), (4, 79), (3, 80), (2, 81), (3, 255),
                                  (2, 256), (3, 257), (2, 700)])
@pytest.mark.parametrize("fmt", T.FORMATS)
def test_pack_unpack_round_trip(n, k, fmt, rng):
    w = ternary(n, k, rng)
    packed = T.PackedTernary.pack(w, fmt)
    rows = -(-n // T.TILE_ROWS) if fmt == "2bit_tiles" else n  # 2bit_tiles: one row of data a tile of 16
    assert packed.data.shape == (rows, T.packed_cols(k, fmt))
    assert torch.equal(unpack(packed), w)


def test_padding_holds_zero_weights(rng):
    w = ternary(3, 300, rng)  # 2-bit: 2 groups (512 weights, 212 padding); base 3: 4 groups (320, 20 padding)
    data2 = T.pack_2bit(w)
    assert data2.shape == (3, 32)
    assert torch.equal(unpack_data(data2, 512, "2bit")[:, 300:], torch.zeros(3, 212, dtype=torch.int8))
    # group 2 holds weights 256..299 in fields j = 0, 1 (all words) and j = 2 (words t < 12); every
    # field from j = 3 up is padding, code 01, in every word of the group
    group2 = data2[:, 16:].to(torch.int64) & 0xFFFFFFFF
    assert (group2 >> 6 == T.ZERO_WORD >> 6).all()
    assert (group2[:, 12:] >> 4 == T.ZERO_WORD >> 4).all()
    data3 = T.pack_base3(w)
    assert data3.shape == (3, 64)
    assert torch.equal(unpack_data(data3, 320, "base3")[:, 300:], torch.zeros(3, 20, dtype=torch.int8))


def test_2bit_layout_is_the_documented_one():
    # weight 16 j + t of a group sits in word t, bits 2j..2j+1, as the code w + 1
    w = torch.zeros(1, 256, dtype=torch.int8)
    w[0, 16 * 5 + 3] = 1  # j = 5, t = 3: code 2
    w[0, 16 * 15 + 0] = -1  # j = 15, t = 0: code 0
    words = T.pack_2bit(w)[0].to(torch.int64) & 0xFFFFFFFF
    assert words[3] == (T.ZERO_WORD & ~(3 << 10)) | (2 << 10)
    assert words[0] == T.ZERO_WORD & ~(3 << 30)


def test_2bit_mma_layout_is_the_documented_one():
    # weight 32 p + 2 t + h of a group sits in word t, bits 16 h + 2 p, as the code w + 1
    w = torch.zeros(1, 512, dtype=torch.int8)
    w[0, 32 * 5 + 2 * 3 + 1] = 1  # p = 5, t = 3, h = 1: bits 26, 27 of word 3, code 2
    w[0, 256 + 32 * 7 + 2 * 15] = -1  # second group, p = 7, t = 15, h = 0: bits 14, 15 of word 16 + 15
    words = T.pack_2bit_mma(w)[0].to(torch.int64) & 0xFFFFFFFF
    assert words[3] == (T.ZERO_WORD & ~(3 << 26)) | (2 << 26)
    assert words[31] == T.ZERO_WORD & ~(3 << 14)
    assert (words[[i for i in range(32) if i not in (3, 31)]] == T.ZERO_WORD).all()


def test_the_pair_decode_bit_by_bit():
    # The pair decode of steps 11 to 14 on the CPU: for every field f < 4 of each half, (word | exponent) & mask is a
    # 16-bit float equal to 0.5 + code 2^(2f-8) (bf16) or 1 + code 2^(2f-10) (fp16), exactly
    codes = torch.cartesian_prod(*[torch.arange(3)] * 4)  # (81, 4): fields 0..3 of a half
    half = (codes << (2 * torch.arange(4))).sum(1)
    for dtype, exp_bits, base, unit in ((torch.bfloat16, 0x3F00, 0.5, 2.0**-8), (torch.float16, 0x3C00, 1.0, 2.0**-10)):
        for f in range(4):
            bits = (half | exp_bits) & ((3 << (2 * f)) | exp_bits)
            value = bits.to(torch.int16).view(dtype).double()
            assert torch.equal(value, base + codes[:, f].double() * unit * 4**f), (dtype, f)


def test_every_base3_byte_and_the_kernel_table():
    # all 243 combinations of 5 weights: pack, unpack, and the table the kernels decode with
    digits = torch.cartesian_prod(*[torch.arange(3)] * 5)  # (243, 5), digit d of weight 16 d
    w = torch.zeros(243, 80, dtype=torch.int8)
    for d in range(5):
        w[:, 16 * d] = digits[:, d] - 1
    data = T.pack_base3(w)
    v = data[:, 0].to(torch.int64)
    assert sorted(v.tolist()) == list(range(243))
    assert torch.equal(unpack_data(data, 80, "base3"), w)
    table = torch.tensor(T.base3_table_values(), dtype=torch.int64) & 0xFFFFFFFF
    assert ((table >> 23) & 0xFF == 0xFF).all()  # the exponent bits the decode expects
    fields = table[v]
    for d in range(5):
        assert torch.equal((fields >> (2 * d)) & 3, digits[:, d])
    assert (table[243:] == table[T.ZERO_BYTE]).all()


@pytest.mark.parametrize("bad, match", [
    (torch.tensor([[0, 2]]), "ternary"),
    (torch.tensor([[0.5, 1.0]]), "ternary"),
    (torch.tensor([[float("nan"), 1.0]]), "ternary"),
    (torch.tensor([[-2, 0]]), "ternary"),
    (torch.tensor([1, 0, -1]), "2-D"),
    (torch.tensor([[True, False]]), "dtype"),
    ([[1, 0]], "torch.Tensor"),
])
@pytest.mark.parametrize("fmt", T.FORMATS)
def test_pack_rejects_non_ternary(bad, match, fmt):
    with pytest.raises((TypeError, ValueError), match=match):
        T.PackedTernary.pack(bad, fmt)


def test_packed_shape_and_dtype_must_match_n_and_k(rng):
    w = ternary(4, 300, rng)
    data2, data3 = T.pack_2bit(w), T.pack_base3(w)
    T.PackedTernary(data2, 4, 300)  # fine
    T.PackedTernary(data2, 4, 257)  # fine too: 257..512 weights take the same 32 words
    with pytest.raises(ValueError, match=r"K=600 in the 2bit format need \(4, 48\)"):
        T.PackedTernary(data2, 4, 600)
    with pytest.raises(ValueError, match="N=5"):
        T.PackedTernary(data2, 5, 300)
    with pytest.raises(ValueError, match=r"K=400 in the base3 format need \(4, 80\)"):
        T.PackedTernary(data3, 4, 400, "base3")
    with pytest.raises(TypeError, match="int32"):
        T.PackedTernary(data3, 4, 300, "2bit")
    with pytest.raises(TypeError, match="uint8"):
        T.PackedTernary(data2, 4, 300, "base3")
    with pytest.raises(ValueError, match="fmt"):
        T.PackedTernary(data2, 4, 300, "3bit")
    with pytest.raises(ValueError, match="contiguous"):
        T.PackedTernary(torch.cat([data2, data2], dim=1)[:, ::2], 4, 300)
    with pytest.raises(ValueError, match="k must be"):
        unpack_data(data2, 0, "2bit")


def test_packed_rejects_invalid_codes(rng):
    for fmt in T.INT32_FORMATS:
        data2 = T.PackedTernary.pack(ternary(2, 256, rng), fmt).data.clone()
        data2.view(-1)[23] |= 3 << 20  # a field with code 3 (row 1, word 7 of the row-major formats)
        with pytest.raises(ValueError, match="not ternary"):
            T.PackedTernary(data2, 2, 256, fmt)
    data3 = T.pack_base3(ternary(2, 80, rng))
    data3[0, 4] = 243
    with pytest.raises(ValueError, match="not ternary"):
        T.PackedTernary(data3, 2, 80, "base3")


# ------------------------------------------------------------------------------------------------
# The tolerance has teeth
# ------------------------------------------------------------------------------------------------

def test_tolerance_catches_one_flipped_weight(rng):
    n, k = 9, 3000
    x, w = torch.randn(2, k, generator=rng), ternary(n, k, rng)
    exact = T.reference(x, w).float()
    assert T.error_ratio(exact, x, w) <= TOL
    nonzero = w.nonzero()
    i, j = nonzero[torch.randint(len(nonzero), (1,), generator=rng)][0].tolist()
    flipped = w.clone()
    flipped[i, j] = -flipped[i, j]
    assert T.error_ratio(T.reference(x, flipped).float(), x, w) > TOL


# ------------------------------------------------------------------------------------------------
# Every step, every config
# ------------------------------------------------------------------------------------------------

#: Every Triton step that takes float x: its wrapper, the weights it reads, and its configs (each test runs them all).
STEPS = {
    "step01_sign": (T.step01_sign, "dense", T.DENSE_CONFIGS),
    "step02_int8": (T.step02_int8, "int8", T.DENSE_CONFIGS),
    "step03_2bit": (T.step03_2bit, "2bit", T.TWO_BIT_CONFIGS),
    "step04_and_decode": (T.step04_and_decode, "2bit", T.TWO_BIT_CONFIGS),
    "step05_gemv": (T.step05_gemv, "2bit", T.GEMV_CONFIGS),
    "step06_dot": (T.step06_dot, "2bit", T.DOT_CONFIGS_FEW + T.DOT_CONFIGS_MANY),
    "step07_base3_gemv": (T.step07_base3_gemv, "base3", T.BASE3_GEMV_CONFIGS),
    "step08_base3_dot": (T.step08_base3_dot, "base3", T.BASE3_DOT_CONFIGS_FEW + T.BASE3_DOT_CONFIGS_MANY),
    "step10_dot_configs": (T.step10_dot_configs, "2bit", T.DOT_MMA_CONFIGS_FEW + T.DOT_MMA_CONFIGS_MANY),
    "step11_pair_decode": (T.step11_pair_decode, "2bit", T.DOT_MMA_CONFIGS_FEW + T.DOT_MMA_CONFIGS_MANY),
    "step12_unmasked": (T.step12_unmasked, "2bit", T.DOT_MMA_CONFIGS_FEW + T.DOT_MMA_CONFIGS_MANY),
    "step13_mma_layout": (T.step13_mma_layout, "2bit_mma", T.DOT_MMA_CONFIGS_FEW + T.DOT_MMA_CONFIGS_MANY),
    "step14_workspace": (T.step14_workspace, "2bit_mma", T.MMA_CONFIGS_FEW + T.MMA_CONFIGS_MANY),
}
DOT_STEPS = ("step06_dot", "step08_base3_dot")  # tl.dot: made for several rows of x
#: Steps 10 to 14: tl.dot at the tensor cores' configs (their many-rows configs choose BLOCK_M themselves).
MMA_STEPS = ("step10_dot_configs", "step11_pair_decode", "step12_unmasked", "step13_mma_layout", "step14_workspace")
ROW_STEPS = ("step01_sign", "step02_int8", "step03_2bit", "step04_and_decode", "step05_gemv",
             "step07_base3_gemv")  # a program a row of x
CASES = [(step, i) for step, (_, _, configs) in STEPS.items() for i in range(len(configs))]


def test_the_table_of_steps_names_every_wrapper():
    for name, (fn, _, _) in STEPS.items():
        assert fn is T.CHAPTER.step(name).function
    assert set(STEPS) | {"step09_w2a8_dot"} == {s.name for s in T.CHAPTER.steps if s.language == "triton"}
    assert set(DOT_STEPS) | set(ROW_STEPS) | set(MMA_STEPS) == set(STEPS)


@pytest.mark.parametrize("step, config_index", CASES, ids=[f"{s}-cfg{i}" for s, i in CASES])
def test_every_step_every_config(step, config_index, rng):
    fn, kind, configs = STEPS[step]
    config = T.config_dict(configs[config_index])
    m = 3 if step in DOT_STEPS + MMA_STEPS else 2
    n, k = 37, 300
    x = x_for(step, torch.randn(m, k, generator=rng).to(DEV))
    w = ternary(n, k, rng)
    scale = 0.75 + torch.rand(1, generator=rng).item()
    out = poisoned(m, n)
    z = fn(x, weights_for(kind, w), scale, out=out, config=config)
    assert z.data_ptr() == out.data_ptr()
    assert_matches(z, x, w.to(DEV), scale)


@pytest.mark.parametrize("step", ["step04_and_decode", "step05_gemv", "step06_dot", "step07_base3_gemv",
                                  "step08_base3_dot", "step10_dot_configs", "step11_pair_decode", "step12_unmasked",
                                  "step13_mma_layout", "step14_workspace"])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_half_precision_activations(step, x_dtype, rng):
    fn, kind, _ = STEPS[step]
    n, k = 19, 161
    x = torch.randn(2, k, generator=rng).to(DEV, x_dtype)
    w = ternary(n, k, rng)
    z = fn(x, weights_for(kind, w), 1.5, out=poisoned(2, n))
    assert_matches(z, x, w.to(DEV), 1.5)


@pytest.mark.parametrize("step", ["step01_sign", "step04_and_decode", "step05_gemv", "step06_dot", "step07_base3_gemv",
                                  "step08_base3_dot", "step11_pair_decode", "step12_unmasked", "step13_mma_layout",
                                  "step14_workspace"])
def test_per_channel_scales_from_absmean(step, rng):
    fn, kind, _ = STEPS[step]
    n, k = 23, 333
    w_float = torch.randn(n, k, generator=rng) * torch.rand(n, 1, generator=rng)
    w, scale = T.quantize_absmean(w_float.to(DEV), per_channel=True)
    x = x_for(step, torch.randn(2, k, generator=rng).to(DEV))
    z = fn(x, weights_for(kind, w.cpu()), scale, out=poisoned(2, n))
    assert_matches(z, x, w, scale)


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float16])
def test_step1_reads_half_precision_weights(w_dtype, rng):
    n, k = 19, 200
    x, w = torch.randn(2, k, generator=rng).to(DEV), ternary(n, k, rng)
    assert_matches(T.step01_sign(x, w.to(DEV, w_dtype), 1.0, out=poisoned(2, n)), x, w.to(DEV))


@pytest.mark.parametrize("bad", [2.0, -3.0, 0.5, float("nan"), float("inf")])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_step1_refuses_weights_that_are_not_ternary(bad, w_dtype, rng):
    """Step 1 selects x by the sign of each weight: a 2 would be read as +1. It must refuse such weights, and
    say which argument and where, instead of returning a wrong product."""
    n, k = 5, 70
    x, w = torch.randn(2, k, generator=rng).to(DEV), ternary(n, k, rng).to(DEV, w_dtype)
    w[3, 41] = bad
    out = poisoned(2, n)
    with pytest.raises(ValueError, match=r"w must be ternary \(-1, 0, \+1\); found .* at index \(3, 41\)"):
        T.step01_sign(x, w, out=out)
    assert torch.isnan(out).all()  # refused before any kernel ran
    w[3, 41] = -1
    assert_matches(T.step01_sign(x, w, out=out), x, w.float())


@pytest.mark.parametrize("bad", [2, -2, 127, -128])
def test_step2_refuses_int8_weights_that_are_not_ternary(bad, rng):
    """Step 2 selects x by the sign of each int8 weight, as step 1 does: a 2 would be read as +1. It must refuse
    such weights, naming the argument and the place, before any kernel runs."""
    n, k = 6, 90
    x, w = torch.randn(2, k, generator=rng).to(DEV), ternary(n, k, rng).to(DEV)
    w[4, 17] = bad
    out = poisoned(2, n)
    with pytest.raises(ValueError, match=r"w must be ternary \(-1, 0, \+1\); found .* at index \(4, 17\)"):
        T.step02_int8(x, w, out=out)
    assert torch.isnan(out).all()  # refused before any kernel ran
    w[4, 17] = 1
    assert_matches(T.step02_int8(x, w, out=out), x, w)


@pytest.mark.parametrize("step", ["step01_sign", "step02_int8"])
def test_steps_1_and_2_skip_the_value_check_when_asked(step, rng):
    """check_values=False is the capturable form of steps 1 and 2 (the check waits for the GPU): the weights,
    checked once by the caller, are not read again before the kernel; the product is the same."""
    fn, kind, _ = STEPS[step]
    n, k = 9, 130
    x, w = torch.randn(3, k, generator=rng).to(DEV), ternary(n, k, rng)
    dense = weights_for(kind, w)
    assert_matches(fn(x, dense, 1.5, out=poisoned(3, n), check_values=False), x, w.to(DEV), 1.5)
    dense[0, 0] = 2  # not checked: the kernel reads it as +1, which is why the check is on by default
    fn(x, dense, check_values=False)
    with pytest.raises(ValueError, match="w must be ternary"):
        fn(x, dense)


def test_vector_input_and_the_dispatcher(rng):
    n, k = 21, 290
    w = ternary(n, k, rng)
    for fmt in T.FORMATS:
        x = x_for(fmt, torch.randn(k, generator=rng).to(DEV))
        packed = T.PackedTernary.pack(w.to(DEV), fmt)
        if fmt == "2bit_tiles" and not runtime.has_gpu():  # steps 17 and 21 are CUDA C++
            with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
                T.ternary_matmul(x, packed, 2.0)
            continue
        z = T.ternary_matmul(x, packed, 2.0)
        assert z.shape == (n,)
        assert_matches(z, x, w.to(DEV), 2.0)
        xs = x_for(fmt, torch.randn(3, k, generator=rng).to(DEV))
        assert_matches(T.ternary_matmul(xs, packed, 2.0), xs, w.to(DEV), 2.0)


# ------------------------------------------------------------------------------------------------
# Steps 12 to 14: the pair decode's masks, its layout, and split-K through a self-cleaning workspace
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m, config_index", [(1, 0), (17, 5), (40, 8), (130, 7)])
def test_mma_more_row_blocks_and_tiles(m, config_index, rng):
    # 17 rows: one 32-row block; 40: one 64-row block (a many-rows config); 130: two 128-row blocks,
    # the last nearly empty.
    # K = 777 is 4 groups, the last one partial; the split configs have more slices than tiles.
    configs = T.MMA_CONFIGS_FEW + T.MMA_CONFIGS_MANY
    n, k = 67, 777
    x = torch.randn(m, k, generator=rng).to(DEV, torch.bfloat16)
    w = ternary(n, k, rng)
    z = T.step14_workspace(x, weights_for("2bit_mma", w), 0.8, out=poisoned(m, n),
                          config=T.config_dict(configs[config_index]))
    assert_matches(z, x, w.to(DEV), 0.8)


@pytest.mark.parametrize("n, k", [(1, 1), (1, 17), (65, 256), (64, 512), (3, 1300)])
def test_mma_edge_shapes(n, k, rng):
    for m, dtype in ((1, torch.bfloat16), (5, torch.float16)):
        x = torch.randn(m, k, generator=rng).to(DEV, dtype)
        w = ternary(n, k, rng)
        for config in (T.MMA_CONFIGS_FEW[0], T.MMA_CONFIGS_FEW[-1]):
            z = T.step14_workspace(x, weights_for("2bit_mma", w), 1.0, out=poisoned(m, n), config=T.config_dict(config))
            assert_matches(z, x, w.to(DEV))


def test_mma_split_workspace_is_left_clean(rng):
    n, k = 45, 600
    x = torch.randn(3, k, generator=rng).to(DEV, torch.bfloat16)
    w = ternary(n, k, rng)
    packed = weights_for("2bit_mma", w)
    split = T.config_dict(T.MMA_CONFIGS_FEW[-1])
    assert split["SPLIT_K"] > 1
    first = T.step14_workspace(x, packed, 1.0, config=split)
    sums, counts = T.SPLIT_WORKSPACE.get(x.device, 3, n)
    assert (sums == 0).all() and (counts == 0).all()
    again = T.step14_workspace(x, packed, 1.0, config=split)  # a second call sees zeros again
    assert_matches(first, x, w.to(DEV))
    torch.testing.assert_close(again, first, rtol=1e-6, atol=1e-6 * first.abs().max().item())


def test_rows_of_zero_weights_give_exact_zeros(rng):
    w = ternary(12, 100, rng)
    w[3] = 0
    for fmt in T.FORMATS if runtime.has_gpu() else [f for f in T.FORMATS if f != "2bit_tiles"]:
        x = x_for(fmt, torch.randn(1, 100, generator=rng).to(DEV))
        z = T.ternary_matmul(x, T.PackedTernary.pack(w.to(DEV), fmt))
        assert z[0, 3].item() == 0.0


# ------------------------------------------------------------------------------------------------
# BitNet's scales, W2A8 (step 9)
# ------------------------------------------------------------------------------------------------

def test_quantize_absmean_follows_bitnet(rng):
    w = torch.randn(6, 50, generator=rng)
    t, scale = T.quantize_absmean(w)
    assert t.dtype == torch.int8 and set(t.unique().tolist()) <= {-1, 0, 1}
    assert math.isclose(scale.item(), 1 / w.abs().mean().item(), rel_tol=1e-6)
    assert torch.equal(t, (w * scale).round().clamp(-1, 1).to(torch.int8))
    tc, sc = T.quantize_absmean(w, per_channel=True)
    assert sc.shape == (6,)
    torch.testing.assert_close(sc, 1 / w.abs().mean(dim=1))
    assert torch.equal(tc, (w * sc[:, None]).round().clamp(-1, 1).to(torch.int8))


def test_quantize_activations_follows_bitnet(rng):
    x = torch.randn(3, 40, generator=rng)
    xq, s = T.quantize_activations(x)
    assert xq.dtype == torch.int8
    torch.testing.assert_close(s, 127 / x.abs().amax(dim=1))
    assert (xq.abs().amax(dim=1) == 127).all()
    assert (xq.float() / s[:, None] - x).abs().max() <= 0.5 / s.min() + 1e-6


@pytest.mark.parametrize("config_index", range(len(T.W2A8_DOT_CONFIGS)))
@pytest.mark.parametrize("per_channel", [False, True])
def test_w2a8_is_exact_integer_math(config_index, per_channel, rng):
    m, n, k = 3, 37, 300
    x = torch.randn(m, k, generator=rng).to(DEV)
    w, w_scale = T.quantize_absmean(torch.randn(n, k, generator=rng).to(DEV), per_channel=per_channel)
    xq, x_scale = T.quantize_activations(x)
    z = T.step09_w2a8_dot(xq, x_scale, T.PackedTernary.pack(w), w_scale, out=poisoned(m, n),
                      config=T.config_dict(T.W2A8_DOT_CONFIGS[config_index]))
    exact = (xq.long() @ w.long().T).double()  # integers: no rounding at all
    ws = w_scale.double() if per_channel else w_scale.double().reshape(1)
    expected = exact / (x_scale.double()[:, None] * ws)
    assert not torch.isnan(z).any()
    torch.testing.assert_close(z.double(), expected, rtol=2e-7, atol=0)


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors(rng):
    n, k = 8, 64
    w = ternary(n, k, rng).to(DEV)
    p2 = T.PackedTernary.pack(w)
    p3 = T.PackedTernary.pack(w, "base3")
    x = torch.randn(2, k).to(DEV)
    cases = [
        (lambda: T.step05_gemv(x.to(torch.float64), p2), TypeError, "x must be one of"),
        (lambda: T.step05_gemv(x.to(torch.int32), p2), TypeError, "x must be one of"),
        (lambda: T.step05_gemv(torch.randn(2, k + 1).to(DEV), p2), ValueError, "K=65 but the weights have K=64"),
        (lambda: T.step06_dot(torch.randn(k, 2).to(DEV).T, p2), ValueError, "contiguous"),
        (lambda: T.step06_dot(torch.randn(1, 2, k).to(DEV), p2), ValueError, "1-D"),
        (lambda: T.step05_gemv(x, w), TypeError, "PackedTernary"),
        (lambda: T.step05_gemv(x, p3), ValueError, "2bit format"),
        (lambda: T.step08_base3_dot(x, p2), ValueError, "base3 format"),
        (lambda: T.step14_workspace(x.to(torch.bfloat16), p2), ValueError, "2bit_mma format"),
        (lambda: T.step14_workspace(x, T.PackedTernary.pack(w, "2bit_mma")), TypeError, "x must be one of"),
        (lambda: T.step04_and_decode(x, p3), ValueError, "2bit format"),
        (lambda: T.step10_dot_configs(x, T.PackedTernary.pack(w, "2bit_mma")), ValueError, "2bit format"),
        (lambda: T.step11_pair_decode(x, p2), TypeError, "x must be one of"),
        (lambda: T.step12_unmasked(x.to(torch.bfloat16), T.PackedTernary.pack(w, "2bit_mma")), ValueError,
         "2bit format"),
        (lambda: T.step13_mma_layout(x.to(torch.bfloat16), p2), ValueError, "2bit_mma format"),
        (lambda: T.step05_gemv(x, p2, 0.0), ValueError, "nonzero"),
        (lambda: T.step05_gemv(x, p2, float("inf")), ValueError, "finite"),
        (lambda: T.step05_gemv(x, p2, torch.ones(n + 1).to(DEV)), ValueError, r"\(8,\)"),
        (lambda: T.step05_gemv(x, p2, torch.ones(n, dtype=torch.float64).to(DEV)), TypeError, "float32"),
        (lambda: T.step05_gemv(x, p2, "2"), TypeError, "scale"),
        (lambda: T.step05_gemv(x, p2, out=torch.empty(2, n + 1).to(DEV)), ValueError, "out"),
        (lambda: T.step05_gemv(x, p2, out=torch.empty(2, n, dtype=torch.float16).to(DEV)), TypeError, "out"),
        (lambda: T.step01_sign(x, w), TypeError, "w must be one of"),
        (lambda: T.step02_int8(x, w[:, :32].contiguous()), ValueError, "K=64 but the weights have K=32"),
        (lambda: T.step02_int8(x, w.to(torch.int16)), TypeError, "w must be one of"),
        (lambda: T.step09_w2a8_dot(x, torch.ones(2).to(DEV), p2), TypeError, "xq must be one of"),
        (lambda: T.step09_w2a8_dot(x.to(torch.int8), torch.ones(3).to(DEV), p2), ValueError, "x_scale"),
        (lambda: T.quantize_absmean(w), TypeError, "floating-point"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()


# ------------------------------------------------------------------------------------------------
# GPU: full size (the bench shapes and awkward neighbours)
# ------------------------------------------------------------------------------------------------

GPU_SHAPES = [(4096, 14336), (4099, 14335), (2563, 2557)]  # the bench checks every bench shape too


def full_size_config(step, m):
    """One config per step for the full-size tests (every config runs in test_gpu_every_config; the
    autotuned path runs, checked, in the benchmark): split-K where there is one, the MMA configs for M."""
    configs = STEPS[step][2]
    if step in MMA_STEPS:
        few = len(T.MMA_CONFIGS_FEW)
        configs = configs[:few] if T.block_m_for(m) <= 32 else configs[few:]
    elif step in DOT_STEPS:
        configs = configs[:3] if T.block_m_for(m) <= 32 else configs[3:]
    split = [c for c in configs if c.kwargs.get("SPLIT_K", 1) > 1]
    return T.config_dict((split or configs)[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("n, k", GPU_SHAPES)
@pytest.mark.parametrize("m", [1, 16, 128])
def test_gpu_full_size(n, k, m):
    gen = torch.Generator(device="cuda").manual_seed(n * 131 + k * 7 + m)
    w_float = torch.randn(n, k, device="cuda", generator=gen)
    w, scale = T.quantize_absmean(w_float, per_channel=True)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    packed = {fmt: T.PackedTernary.pack(w, fmt) for fmt in T.FORMATS}
    steps = ["step06_dot", "step08_base3_dot", *MMA_STEPS]
    if m == 1:
        steps += list(ROW_STEPS)
    weights = {"dense": w.to(torch.bfloat16), "int8": w, **packed}
    for step in steps:
        fn, kind, _ = STEPS[step]
        z = fn(x, weights[kind], scale, out=poisoned(m, n), config=full_size_config(step, m))
        assert not torch.isnan(z).any(), step
        ratio = T.error_ratio(z, x, w, scale)
        assert ratio <= TOL, f"{step}: {ratio:.2e}"
    if m == 16:  # step 14 decodes fp16 weights for fp16 x
        xh = x.half()
        z = T.step14_workspace(xh, packed["2bit_mma"], scale, out=poisoned(m, n))
        assert T.error_ratio(z, xh, w, scale) <= TOL
    xq, x_scale = T.quantize_activations(x)
    z = T.step09_w2a8_dot(xq, x_scale, packed["2bit"], scale, out=poisoned(m, n))
    expected = (xq.double() @ w.double().T) / (x_scale.double()[:, None] * scale.double())
    torch.testing.assert_close(z.double(), expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("step, config_index", CASES, ids=[f"{s}-cfg{i}" for s, i in CASES])
def test_gpu_every_config(step, config_index):
    fn, kind, configs = STEPS[step]
    gen = torch.Generator().manual_seed(config_index)
    # N, K: multiples of 16 (Triton specializes on that, so these are the benchmark's compiled
    # kernels), but not of any block, of the 256-weight groups or of the 80-weight base-3 groups.
    # (test_gpu_full_size runs N = 4099, K = 14335.)
    n, k, m = 4112, 3344, 1 if step in ROW_STEPS else 17
    if step in MMA_STEPS and config_index >= len(T.MMA_CONFIGS_FEW):
        m = 130  # the many-rows configs: 64- and 128-row blocks, two or three blocks of x rows
    x = torch.randn(m, k, generator=gen).to(DEV, torch.bfloat16)
    w = ternary(n, k, gen)
    z = fn(x, weights_for(kind, w), 1.25, out=poisoned(m, n), config=T.config_dict(configs[config_index]))
    assert_matches(z, x, w.to(DEV), 1.25)


# ------------------------------------------------------------------------------------------------
# As a library: bad weights, a wrong output buffer, a plan's capacity
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_absmean_refuses_weights_that_are_not_finite(bad, per_channel, rng):
    """A NaN or an infinity would quantise every weight to 0 with a NaN scale, and every kernel would then
    compute that without complaint."""
    w = torch.randn(4, 40, generator=rng)
    w[2, 17] = bad
    with pytest.raises(ValueError, match=r"w must hold finite weights.*1 of its 160 values.*w\[2, 17\]"):
        T.quantize_absmean(w, per_channel=per_channel)


def test_a_wrong_out_says_what_it_was(rng):
    w = ternary(5, 64, rng)
    x = torch.randn(2, 64, generator=rng).to(DEV)
    packed = T.PackedTernary.pack(w.to(DEV), "2bit")
    with pytest.raises(TypeError, match=r"out must be a float32 tensor of 2 x 5 = 10 elements \(any shape\), "
                                         r"contiguous, on \w+(:\d)?; got a float64 tensor of shape \(2, 5\) on "):
        T.step06_dot(x, packed, out=torch.empty(2, 5, dtype=torch.float64, device=DEV))
    with pytest.raises(ValueError, match=r"got a float32 tensor of shape \(2, 4\) on "):
        T.step06_dot(x, packed, out=torch.empty(2, 4, device=DEV))
    with pytest.raises(ValueError, match=r"got a float32 tensor of shape \(5, 2\) on \w+(:\d)?, not contiguous"):
        T.step06_dot(x, packed, out=torch.empty(2, 5, device=DEV).t())
    with pytest.raises(TypeError, match=r"out must be .*; got a list"):
        T.step06_dot(x, packed, out=[0.0] * 10)
    assert_matches(T.step06_dot(x, packed, out=torch.empty(10, device=DEV)).view(2, 5), x, w)  # any shape of 10


def test_a_timeline_refuses_a_launch_its_trace_cannot_hold():
    """Step 23's timeline gives each block 64 slots below quantize_x's at 120000: a launch of more blocks (an LM
    head's N) would write over those, then past the trace."""
    from studylog.ternary.w2a8 import TIMELINE_BLOCKS, check_timeline_grid

    def grid_of(n, k):
        quant, cfg = T.w2a8_choose(1, n, k)
        return T.w2a8_grid(1, n, k, cfg, fused=quant != T.Quant.SEPARATE)[1]

    check_timeline_grid(grid_of(14336, 4096))
    grid = grid_of(128256, 4096)
    assert math.prod(grid) > TIMELINE_BLOCKS == 1875
    with pytest.raises(ValueError, match=r"holds 1875 blocks of 64 slots, and this launch has \d+"):
        check_timeline_grid(grid)
