"""BitNet's W2A8 kernel as chapter 5's peer: its packed layout, read back the way its kernel reads it, and its
scales. The kernel itself runs on the GPU only (the benchmark builds it from a checkout of microsoft/BitNet and
checks it against the float64 reference); here its reading of the packed weights is emulated in float64 on the CPU,
at sizes it is compiled for in miniature (N a multiple of 16, K of 128) and on fresh random weights and x."""

import os
import sys

import pytest
import torch
from torch import Tensor

from studylog.ternary import bitnet
from studylog.ternary.formats import quantize_activations


def emulate_bitnet_kernel(xq: Tensor, packed: Tensor, s: float, ws: float) -> Tensor:
    """What ``ladder_int8xint2_kernel`` computes, in float64 on the CPU, read the way its threads read: block
    ``bx`` of 16 rows, threads ``(tx < 8, ty < 16)``, a 32-bit word of codes and 16 bytes of x per step of 128
    columns; each code ``(word >> (8 b + 2 i)) & 3`` minus 2 meets ``x[16 tx + 4 i + b]``. A packed
    layout that this reads back to the weights is the layout the kernel expects."""
    n, k = packed.shape[0], packed.shape[1] * 4
    words = packed.contiguous().view(torch.int32).reshape(-1).to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros(n, dtype=torch.float64)
    x = xq.reshape(-1).to(torch.float64)
    for bx in range(n // 16):
        for ty in range(16):
            acc = 0.0
            for k0 in range(k // 128):
                for tx in range(8):
                    byte = (bx * 16 * k // 4 + k0 * 512 + (tx >> 1) * 128 + (ty >> 3) * 64 + (tx & 1) * 32
                            + (ty & 7) * 4)
                    word = int(words[byte // 4])
                    for i in range(4):
                        for b in range(4):
                            code = ((word >> (8 * b + 2 * i)) & 3) - 2
                            acc += code * float(x[k0 * 128 + tx * 16 + 4 * i + b])
            out[bx * 16 + ty] = acc / s * ws
    return out


def random_ternary(n, k, rng):
    return torch.randint(-1, 2, (n, k), generator=rng, dtype=torch.int8)


@pytest.mark.parametrize("n, k", [(16, 128), (48, 384), (32, 640)])
def test_the_kernel_reads_the_packed_weights_back(n, k, rng):
    w = random_ternary(n, k, rng)
    x = torch.randn(1, k, generator=rng)
    xq, x_scale = quantize_activations(x)
    scale = float(torch.rand(1, generator=rng)) + 0.5
    s, ws = bitnet.bitnet_scales(x_scale, scale, "cpu")
    got = emulate_bitnet_kernel(xq, bitnet.bitnet_pack(w), float(s), float(ws[0]))
    want = (xq.double() @ w.double().T).reshape(-1) / float(s) * float(ws[0])  # float64, the same scales
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-9)


def test_a_mistake_in_the_layout_is_caught(rng):
    """Swapping two packed bytes of one row changes what the kernel reads (the emulation is not blind to order). A
    single swap can leave the product unchanged by chance (two bytes whose weights sum alike, moved by the same
    offset of x), so every swap of two different bytes among the row's first eight is tried: an emulation blind to
    order misses them all."""
    w = random_ternary(16, 128, rng)
    w[0, :8] = torch.tensor([1, -1, 0, 1, -1, -1, 1, 0], dtype=torch.int8)
    xq = torch.arange(-64, 64, dtype=torch.int8).reshape(1, 128)
    packed = bitnet.bitnet_pack(w)
    want = (xq.double() @ w.double().T).reshape(-1)
    assert torch.allclose(emulate_bitnet_kernel(xq, packed, 1.0, 1.0), want)
    caught = tried = 0
    for i in range(8):
        for j in range(i + 1, 8):
            if packed[0, i] == packed[0, j]:
                continue
            bad = packed.clone()
            bad[0, [i, j]] = bad[0, [j, i]]
            tried += 1
            caught += not torch.allclose(emulate_bitnet_kernel(xq, bad, 1.0, 1.0), want)
    assert tried and caught, f"none of {tried} swaps of two packed bytes changed the emulated product"


def test_bad_weights_are_named():
    with pytest.raises(ValueError, match="w must have N a multiple of 16 and K of 32"):
        bitnet.bitnet_pack(torch.zeros(15, 64, dtype=torch.int8))
    with pytest.raises(ValueError, match="w must be ternary"):
        bitnet.bitnet_pack(torch.full((16, 64), 2, dtype=torch.int8))
    with pytest.raises(TypeError, match="w must be"):
        bitnet.bitnet_pack(torch.zeros(16, 64))


def test_a_checkout_without_the_kernel_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(bitnet.BITNET_ENV, raising=False)
    assert bitnet.bitnet_checkout() is None
    monkeypatch.setenv(bitnet.BITNET_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no gpu/bitnet_kernels/bitnet_kernels.cu"):
        bitnet.bitnet_checkout()


@pytest.mark.skipif(not os.environ.get(bitnet.BITNET_ENV), reason="no checkout of microsoft/BitNet given")
def test_the_layout_is_bitnets_own(rng):
    """Where a checkout is given, our packing equals its convert_weight_int8_to_int2 byte for byte."""
    root = bitnet.bitnet_checkout()
    sys.path.insert(0, str(root / "gpu"))
    try:
        from pack_weight import convert_weight_int8_to_int2
    finally:
        sys.path.pop(0)
    w = random_ternary(64, 256, rng)
    assert torch.equal(bitnet.bitnet_pack(w), convert_weight_int8_to_int2(w))
