"""Chapter 5's exercises, each with a check that a reader runs on a CPU.

Every ``check_*`` function runs the reader's function on small random inputs against the chapter's reference
(the packers and quantisers of :mod:`studylog.ternary.formats`, or the rule the kernels follow), prints what is
wrong on the first input where it disagrees, and returns ``True`` when every input agrees; a function that still
raises ``NotImplementedError`` (the page's stub) gets a note instead of a traceback. The answers live in
:mod:`book.ternary.solutions`, which the notebooks do not import.

Lesson 1 (Triton):

1. :func:`check_unpack_2bit`: the weights of one group of the 2-bit format, from its 16 words.
2. :func:`check_field_float`: the bit pattern that turns a 2-bit field into a float with one AND.
3. :func:`check_base3`: five weights in one byte, and back.
4. :func:`check_absmean`: BitNet b1.58's absmean quantisation of a weight matrix.
6. :func:`check_gemv_kernel`: a copy of step 5's Triton kernel with one change (its decode by shifts and a mask),
   run in Triton's interpreter on awkward sizes and, on a GPU, timed against step 5.

Lesson 2 (CUDA C++):

7. :func:`check_mma_position`: where weight k of a group sits in the MMA-order words.
8. :func:`check_w2a8_sum`: the four int8 accumulators of steps 22 to 25 back to ``sum x w``.
9. :func:`check_round_int8`: BitNet's int8 rounding of x, as the kernels must match it.
10. :func:`check_ring_waits`: which stage and which mbarrier phase a ring of stages waits on.
12. :func:`check_magic_literal`: step 21's kernel file with its decode's constant written as a literal, compiled by
    NVRTC and its SASS counted against steps 20 and 21 (on a Hopper GPU, also run against step 21).

Part 1's exercise 5 (step 14's tile) and part 2's exercise 5 (step 25's tiles) change a kernel's launch and time it on
a GPU (:func:`book.common.gpu_us`); on a CPU, part 1's exercise 5 checks the reader's tile in Triton's interpreter.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from book.common import gpu_us, guarded, report
from book.ternary.lesson import SASS_INSTANCES
from studylog import runtime
from studylog.ternary.formats import (FP32_TOLERANCE, PackedTernary, error_ratio, pack_2bit, pack_2bit_mma, pack_base3,
                                      quantize_absmean, quantize_activations)

__all__ = ["check_unpack_2bit", "check_field_float", "check_base3", "check_absmean", "check_gemv_kernel",
           "check_mma_position", "check_w2a8_sum", "check_round_int8", "check_ring_waits", "check_magic_literal",
           "step21_source", "step21_with"]


def _u32(v: int) -> int:
    return int(v) & 0xFFFFFFFF


def _ternary(gen: torch.Generator, *shape: int) -> Tensor:
    return (torch.randint(0, 3, shape, generator=gen) - 1).to(torch.int8)


# --------------------------------------------------------------------------------------
# 1. One group of the 2-bit format
# --------------------------------------------------------------------------------------

@guarded
def check_unpack_2bit(fn: Callable[[Sequence[int]], Sequence[int]], cases: int = 40) -> bool:
    """``fn(words) -> 256 weights`` on random groups packed by :func:`~studylog.ternary.formats.pack_2bit`."""
    gen = torch.Generator().manual_seed(51)
    for _ in range(cases):
        w = _ternary(gen, 1, 256)
        words = [_u32(v) for v in pack_2bit(w)[0].tolist()]
        got = [int(v) for v in fn(list(words))]
        want = w[0].tolist()
        if got != want:
            k = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b) if len(got) == 256 else None
            where = f"{len(got)} weights instead of 256" if k is None else \
                f"weight {k} (word {k % 16}, field {k // 16}) is {got[k]}, should be {want[k]}"
            return report("check_unpack_2bit", False, where, cases)
    return report("check_unpack_2bit", True, None, cases)


# --------------------------------------------------------------------------------------
# 2. A field as a float with one AND (step 4's decode)
# --------------------------------------------------------------------------------------

def _as_float(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32).item()


@guarded
def check_field_float(fn: Callable[[int, int], int], cases: int = 200) -> bool:
    """``fn(word, f) -> bits``: the bits must read as the float32 ``2^(23 - 2f) + code`` of field f, so that
    subtracting ``2^(23 - 2f) + 1`` leaves the weight; and they must come from one AND of the word's low 16 bits
    with all exponent bits set (no shift of the field)."""
    gen = torch.Generator().manual_seed(52)
    for _ in range(cases):
        w = _ternary(gen, 1, 256)
        word = _u32(pack_2bit(w)[0, int(torch.randint(0, 16, (1,), generator=gen))])
        for f in range(8):
            bits = _u32(fn(word, f))
            code = (word >> (2 * f)) & 3
            value = _as_float(bits)
            if value != 2.0 ** (23 - 2 * f) + code:
                return report("check_field_float", False, f"word {word:#010x}, field {f} (code {code}): bits "
                               f"{bits:#010x} read as {value!r}, want 2^{23 - 2 * f} + {code}", cases)
            if bits & ~(((word & 0xFFFF) | 0x7F800000)) & 0xFFFFFFFF:
                return report("check_field_float", False, f"word {word:#010x}, field {f}: bits {bits:#010x} set a "
                               "bit that the word with its exponent bits set does not have (one AND cannot)", cases)
    return report("check_field_float", True, None, cases)


# --------------------------------------------------------------------------------------
# 3. Five weights in a byte (base 3)
# --------------------------------------------------------------------------------------

@guarded
def check_base3(encode: Callable[[Sequence[int]], int], decode: Callable[[int], Sequence[int]]) -> bool:
    """``encode(five weights) -> byte`` against :func:`~studylog.ternary.formats.pack_base3` (byte t of a group
    holds weights 16 d + t as digit d) for all 243 combinations, and ``decode(byte)`` back."""
    cases = 3**5
    for v in range(cases):
        weights = [(v // 3**d) % 3 - 1 for d in range(5)]
        row = torch.zeros(1, 80, dtype=torch.int8)
        row[0, [0, 16, 32, 48, 64]] = torch.tensor(weights, dtype=torch.int8)
        want = int(pack_base3(row)[0, 0])
        got = int(encode(list(weights)))
        if got != want:
            return report("check_base3", False, f"encode({weights}) = {got}, the format's byte is {want}", cases)
        back = [int(w) for w in decode(want)]
        if back != weights:
            return report("check_base3", False, f"decode({want}) = {back}, want {weights}", cases)
    return report("check_base3", True, None, cases)


# --------------------------------------------------------------------------------------
# 4. BitNet's absmean quantisation
# --------------------------------------------------------------------------------------

@guarded
def check_absmean(fn: Callable[[Tensor], tuple[Tensor, Tensor]], cases: int = 30) -> bool:
    """``fn(W) -> (W_t, scale)`` against :func:`~studylog.ternary.formats.quantize_absmean` (per tensor) on
    random matrices of different spreads."""
    gen = torch.Generator().manual_seed(54)
    for i in range(cases):
        n, k = int(torch.randint(1, 9, (1,), generator=gen)), int(torch.randint(1, 40, (1,), generator=gen))
        w = torch.randn(n, k, generator=gen) * float(torch.rand(1, generator=gen) * 3 + 0.01)
        want_w, want_s = quantize_absmean(w)
        got_w, got_s = fn(w.clone())
        if not torch.allclose(torch.as_tensor(got_s, dtype=torch.float32), want_s, rtol=1e-5):
            return report("check_absmean", False, f"a {n} x {k} matrix: scale {float(got_s):.6g}, want "
                           f"{float(want_s):.6g} (1 / mean |W|)", cases)
        if not torch.equal(torch.as_tensor(got_w).to(torch.int8), want_w):
            return report("check_absmean", False, f"a {n} x {k} matrix: the ternary weights differ from "
                           "clamp(round(W * scale), -1, 1)", cases)
    return report("check_absmean", True, None, cases)


# --------------------------------------------------------------------------------------
# 6. Step 5's kernel with one change (a Triton kernel of the reader's)
# --------------------------------------------------------------------------------------

#: Sizes of the interpreter run: K and N not multiples of a group (256 weights), of a tile or of BLOCK_N, one row
#: or two; and the tiles, one of them split K.
GEMV_CASES = ((1, 1, 1), (1, 7, 300), (2, 13, 17), (1, 37, 600), (1, 9, 1000), (2, 5, 513))
GEMV_TILES = ({"BLOCK_N": 8, "BLOCK_KW": 32, "SPLIT_K": 1}, {"BLOCK_N": 4, "BLOCK_KW": 16, "SPLIT_K": 3})


def run_gemv(kernel, x: Tensor, packed: PackedTernary, scale: Tensor, tile: dict) -> Tensor:
    """Launch a kernel with step 5's arguments (:func:`studylog.ternary.step05_gemv_kernel`'s signature) on one
    tile ``{"BLOCK_N", "BLOCK_KW", "SPLIT_K"}`` (and optionally ``num_warps``); returns z, zeroed first because
    split-K programs add into it."""
    import triton

    tile = dict(tile)
    num_warps = tile.pop("num_warps", 4)
    tile.pop("num_stages", None)
    (m, k), n, data = x.shape, packed.n, packed.data
    z = torch.zeros(m, n, device=x.device)
    grid = (triton.cdiv(n, tile["BLOCK_N"]), tile["SPLIT_K"], m)
    kernel[grid](x, data, z, scale, n, k, data.shape[1], x.stride(0), data.stride(0), z.stride(0), scale.stride(0),
                 **tile, num_warps=num_warps)
    return z


@guarded
def check_gemv_kernel(kernel, time_it: bool = True) -> bool:
    """``kernel``: a ``@triton.jit`` kernel with step 5's signature, run by :func:`run_gemv` on random ternary
    weights packed as ``"2bit"``, random x and per-row scales, at the sizes of :data:`GEMV_CASES` and the tiles of
    :data:`GEMV_TILES`, against the float64 product (:func:`~studylog.ternary.formats.error_ratio` within
    ``FP32_TOLERANCE``). In Triton's interpreter on a CPU; on a GPU the same sizes compile for it, and then (with
    ``time_it``) it is timed against step 5's kernel at 4096 x 14336, one row, on step 5's configs."""
    if "NotImplementedError" in getattr(getattr(getattr(kernel, "fn", kernel), "__code__", None), "co_names", ()):
        raise NotImplementedError  # the page's stub (a kernel that raises): a note, not a launch
    from studylog.ternary.triton_steps import GEMV_CONFIGS, config_dict, step05_gemv_kernel

    dev = runtime.device()
    gen = torch.Generator().manual_seed(58)
    cases = 0
    for m, n, k in GEMV_CASES:
        w = _ternary(gen, n, k)
        x = torch.randn(m, k, generator=gen)
        scale = torch.rand(n, generator=gen) + 0.5
        packed = PackedTernary.pack(w.to(dev), "2bit")
        for tile in GEMV_TILES:
            cases += 1
            z = run_gemv(kernel, x.to(dev), packed, scale.to(dev), tile).cpu()
            ratio = error_ratio(z, x, w, scale)
            if not ratio <= FP32_TOLERANCE:
                row, col = divmod(int(((z.double() - (x.double() @ w.double().T) / scale.double()).abs()
                                       .nan_to_num(nan=float("inf")).argmax())), n)
                return report("check_gemv_kernel", False, f"x {m} x {k}, W {n} x {k}, tile {tile}: error {ratio:.1e} "
                               f"of sum |x||w| (tolerance {FP32_TOLERANCE:.0e}), worst at z[{row}, {col}] = "
                               f"{float(z[row, col]):.6g}", cases)
    report("check_gemv_kernel", True, None, cases)
    if time_it:
        if runtime.mode() != "gpu":
            print("check_gemv_kernel: no timing here: Triton's interpreter checks what a kernel computes, not how "
                  "fast (on a GPU this cell also times it against step 5)")
        else:
            n, k = 4096, 14336
            x = torch.randn(1, k, device=dev).to(torch.bfloat16)
            packed = PackedTernary.pack(torch.randint(-1, 2, (n, k), device=dev, dtype=torch.int8), "2bit")
            scale = torch.ones(n, device=dev)
            for config in (config_dict(c) for c in GEMV_CONFIGS):
                yours = gpu_us(lambda: run_gemv(kernel, x, packed, scale, config))
                step5 = gpu_us(lambda: run_gemv(step05_gemv_kernel, x, packed, scale, config))
                tile = {key: v for key, v in config.items() if key.isupper()}
                print(f"{tile}: yours {yours:,.1f} µs, step 5 {step5:,.1f} µs ({yours / step5:.2f}x)")
    return True


def step14_configs(count: int = 3) -> list[dict]:
    """The first ``count`` configs of step 14's autotuner as dicts (rows and words of its tile, slices of K, warps,
    stages): exercise 5 times the reader's tile beside them."""
    from studylog import ternary as T

    return [T.config_dict(c) for c in T.STEP_CONFIGS[14][:count]]


# --------------------------------------------------------------------------------------
# 7. Where a weight sits in the MMA order
# --------------------------------------------------------------------------------------

@guarded
def check_mma_position(fn: Callable[[int], tuple[int, int]], cases: int = 20) -> bool:
    """``fn(k) -> (word, bit)`` for every weight of a group, against
    :func:`~studylog.ternary.formats.pack_2bit_mma` on random groups: the code ``w + 1`` of weight k must be
    ``(words[word] >> bit) & 3``."""
    gen = torch.Generator().manual_seed(55)
    for _ in range(cases):
        w = _ternary(gen, 1, 256)
        words = [_u32(v) for v in pack_2bit_mma(w)[0].tolist()]
        seen = set()
        for k in range(256):
            t, bit = (int(v) for v in fn(k))
            if not (0 <= t < 16 and 0 <= bit <= 30) or (t, bit) in seen:
                return report("check_mma_position", False, f"weight {k}: ({t}, {bit}) is not a free 2-bit field of "
                               "the group's 16 words", cases)
            seen.add((t, bit))
            if ((words[t] >> bit) & 3) - 1 != int(w[0, k]):
                return report("check_mma_position", False, f"weight {k} is not at word {t}, bit {bit}", cases)
    return report("check_mma_position", True, None, cases)


# --------------------------------------------------------------------------------------
# 8. The four accumulators of steps 22 to 25
# --------------------------------------------------------------------------------------

@guarded
def check_w2a8_sum(fn: Callable[[Sequence[int], int], int], cases: int = 300) -> bool:
    """``fn(acc, x_sum) -> sum x w`` on random rows: 4 x 64 weights, int8 x, the accumulators built as step 22's
    int8 MMAs build them (the AND with ``0x03030303 << 2p`` leaves ``code << 2p`` in a byte)."""
    gen = torch.Generator().manual_seed(56)
    for _ in range(cases):
        w = (torch.randint(0, 3, (4, 64), generator=gen) - 1).long()
        x = torch.randint(-128, 128, (4, 64), generator=gen).long()
        acc = [int((((w[p] + 1) << (2 * p)) * x[p]).sum()) for p in range(4)]
        want = int((w * x).sum())
        got = int(fn(list(acc), int(x.sum())))
        if got != want:
            return report("check_w2a8_sum", False, f"accumulators {acc}, x_sum {int(x.sum())}: got {got}, "
                           f"sum x w is {want}", cases)
    return report("check_w2a8_sum", True, None, cases)


# --------------------------------------------------------------------------------------
# 9. Rounding x to int8 as BitNet does
# --------------------------------------------------------------------------------------

@guarded
def check_round_int8(fn: Callable[[Tensor], tuple[Tensor, Tensor]], cases: int = 50) -> bool:
    """``fn(x_row) -> (q, scale)`` against :func:`~studylog.ternary.formats.quantize_activations` on random rows,
    half of them built so that many products land exactly on a half (where rounding half up and half to even
    differ)."""
    gen = torch.Generator().manual_seed(57)
    for i in range(cases):
        k = int(torch.randint(1, 300, (1,), generator=gen))
        if i % 2:
            x = torch.randn(k, generator=gen)
        else:  # x = (n + 0.5) / 127 * amax: products on halves
            x = (torch.randint(-127, 127, (k,), generator=gen).float() + 0.5)
            x[0] = 127.0
        want_q, want_s = quantize_activations(x[None])
        got_q, got_s = fn(x.clone())
        if not torch.allclose(torch.as_tensor(got_s, dtype=torch.float32).reshape(()), want_s[0], rtol=1e-6):
            return report("check_round_int8", False, f"scale {float(got_s):.6g}, want {float(want_s[0]):.6g}", cases)
        got_q = torch.as_tensor(got_q).reshape(-1).to(torch.int16)
        bad = (got_q != want_q[0].to(torch.int16)).nonzero()
        if len(bad):
            j = int(bad[0])
            return report("check_round_int8", False, f"x = {float(x[j])!r} (x * scale = "
                           f"{float(x[j] * want_s[0])!r}) gives {int(got_q[j])}, want {int(want_q[0, j])}", cases)
    return report("check_round_int8", True, None, cases)


# --------------------------------------------------------------------------------------
# 10. The waits of a ring of stages
# --------------------------------------------------------------------------------------

@guarded
def check_ring_waits(fn: Callable[[int, int], tuple[int, int, Optional[int]]]) -> bool:
    """``fn(c, stages)`` for chunks 0..63 of rings of 1 to 8 stages, against a simulation of the mbarriers: each
    completes a phase when its arrivals are in, and a wait on parity P returns once the phase of parity P has
    completed (the rule of ``mbarrier.try_wait.parity``)."""
    cases = 0
    for stages in range(1, 9):
        full_done = [0] * stages  # phases completed on each "full" barrier
        empty_done = [0] * stages
        for c in range(64):
            cases += 1
            s, lap = c % stages, c // stages
            # the producer may refill stage s once the consumers have emptied it `lap` times: it waits for the
            # phase that completes the lap-th emptying, number lap - 1, whose parity is (lap - 1) & 1
            want_empty = None if lap == 0 else (empty_done[s] - 1) & 1
            full_done[s] += 1  # the copy lands: phase number `lap` of the full barrier completes
            want_full = (full_done[s] - 1) & 1
            empty_done[s] += 1  # the consumers free it
            got = tuple(fn(c, stages))
            got = (int(got[0]), int(got[1]), None if got[2] is None else int(got[2]))
            if got != (s, want_full, want_empty):
                return report("check_ring_waits", False, f"chunk {c} of a ring of {stages}: got {got}, want "
                               f"{(s, want_full, want_empty)} (stage, full parity, empty parity)", cases)
    return report("check_ring_waits", True, None, cases)


# --------------------------------------------------------------------------------------
# 12. Change a kernel: step 21's constant as a literal
# --------------------------------------------------------------------------------------

#: Step 21's kernel file and the instance the page's SASS counts read: one tile of 16 weight rows, bf16 x, 4 stages
#: of one group; its last template flag is step 21's (the constant in a register), false in step 20's.
STEP21_FILE, STEP21_INSTANCE = SASS_INSTANCES[21]


def step21_source() -> str:
    """Step 21's kernel file (``ternary_bulk.cu``), as text: what part 2's exercise 6 starts from."""
    from studylog import cuda

    return cuda.read_source(STEP21_FILE)


def step21_with(source: str) -> Callable[[Tensor, PackedTernary], Tensor]:
    """``fn(x, w) -> z``: step 21 at one row of bf16 x (K a multiple of 8) with its kernel compiled from ``source``,
    launched as :func:`studylog.ternary.step21_magic_reg` launches it at 4096 x 14336 (one tile of 16 rows a block, 8
    consumer warps, 4 stages of one group, K in one slice). Hopper GPUs only."""
    import triton

    from studylog import cuda
    from studylog.ternary import cuda_steps as C

    cfg = C.TmaConfig(row_tiles=1, warps=8, stages=4, chunk=1, slices=1)
    kernel = cuda.load(source, name_expressions=(STEP21_INSTANCE,)).kernel(STEP21_INSTANCE, C.CUDA_MMA_SIGNATURE)
    kernel.set_max_dynamic_shared_memory(C.SMEM_LIMIT)

    def run(x: Tensor, w: PackedTernary) -> Tensor:
        x2, _, w, s, s_stride, z = C.cuda_call_args(x, w, 1.0, None, None, C.TmaConfig, "exercise 6")
        m, k = x2.shape
        if m != 1 or x2.dtype != torch.bfloat16 or k % 8:
            raise ValueError(f"x must be one row of bf16 with K a multiple of 8, got {tuple(x2.shape)} {x2.dtype}")
        groups = triton.cdiv(k, 256)
        if groups > C.tma_max_groups_per_slice(cfg, 1):
            raise ValueError(f"K = {k}: x does not fit beside the stages in one slice")
        kernel((triton.cdiv(w.n, cfg.rows), 1, 1), (32 * (cfg.warps + 1),), x2, w.data, z, s, None, None, m, w.n, k,
               groups, x2.stride(0), s_stride, groups, shared_mem=C.tma_smem_bytes(cfg, 1, groups))
        return z
    return run


@guarded
def check_magic_literal(fn: Callable[[str], str]) -> bool:
    """Part 2, exercise 6. ``fn(source)`` -> step 21's kernel file (:func:`step21_source`) with the decode's constant no
    longer read from shared memory but written as a literal (``0x43004300u`` for bf16 x).

    On any machine NVRTC compiles the file for :data:`STEP21_INSTANCE`, and the check prints the SASS's counts
    beside steps 20 and 21 (all instructions, LOP3s, and the moves that build ``0x43004300`` in a register). Yours
    must have more of those moves than step 21. On a Hopper GPU your kernel then runs at 4096 x 14336 against step
    21, bit for bit; without one that part is skipped (it says so)."""
    from book.ternary.lesson import cuobjdump, sass_counts
    from studylog import cuda

    original = step21_source()
    text = fn(original)
    if not isinstance(text, str) or text == original:
        return report("check_magic_literal", False, "fn returned step 21's source unchanged: return the changed text",
                      1)
    if cuobjdump() is None:
        return report("check_magic_literal", False, "no cuobjdump here to read the SASS (Triton's wheel carries one)",
                      1)
    try:
        mine = sass_counts(21, text)
    except cuda.CudaCompileError as exc:  # the compile log says where
        return report("check_magic_literal", False, f"your source does not compile to {STEP21_INSTANCE}: {exc}", 1)
    rows = {"step 20": sass_counts(20), "step 21": sass_counts(21), "yours": mine}
    print(f"SASS for sm_90 of {STEP21_INSTANCE} (step 20's: its last flag false):")
    for key in ("instructions", "LOP3", "magic moves"):
        print(f"  {key:>12}: " + ", ".join(f"{who} {c[key]}" for who, c in rows.items()))
    if mine["magic moves"] <= rows["step 21"]["magic moves"]:
        return report("check_magic_literal", False, "no more moves of 0x43004300 than step 21's: ptxas still cannot "
                      "see the constant's value (or the change is elsewhere)", 1)
    if not (runtime.has_gpu() and torch.cuda.get_device_capability()[0] >= 9):
        print("check_magic_literal: your change is in the machine code; no Hopper GPU, so your kernel was compiled, "
              "not run (on one this check also runs it against step 21)")
        return True
    from studylog.ternary import step21_magic_reg

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 14336, generator=gen).to("cuda", torch.bfloat16)
    w = PackedTernary.pack(_ternary(gen, 4096, 14336).cuda(), "2bit_tiles")
    if not torch.equal(step21_with(text)(x, w), step21_magic_reg(x, w)):
        return report("check_magic_literal", False, "your kernel's output differs from step 21's at 4096 x 14336", 1)
    print("check_magic_literal: your kernel's output equals step 21's at 4096 x 14336")
    return True
