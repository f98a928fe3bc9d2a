"""Chapter 5, ternary matmul, steps 15 to 25 (CUDA C++): compiled and checked on the CPU (PTX, SASS, register
counts, launch plans), run on a GPU (``-m gpu``); and what reads the chapter's results (report, lab/ternary).
"""

import pytest
import torch

from book.ternary import figures
from book.ternary import results as tables
from studylog import runtime
from studylog import ternary as T
from studylog.ternary import formats as F
from studylog.ternary import report as REPORT

from ternary_helpers import DEV, TOL, assert_matches, poisoned, ternary, weights_for, x_for  # noqa: F401


def w2a8_x_order(k: int, device=None):
    """Step 22's order of a row of quantised x: byte ``b`` (K padded to 256) holds ``x[order[b]]``; in a group,
    byte ``64 p + 16 t + 4 i + j`` meets code ``p`` of byte ``j`` of word ``4 t + i`` (ternary_w2a8.cu)."""
    b = torch.arange(-(-k // 256) * 256, device=device)
    within = b % 256
    p, t, i, j = within >> 6, (within >> 4) & 3, (within >> 2) & 3, within & 3
    return b - within + 32 * p + 2 * (4 * t + i) + 128 * (j & 1) + (j >> 1)


def w2a8_compiled(instances):
    """(PTX, ptxas report) of ``instances`` of ternary_w2a8.cu, read per kernel from one compile of every instance
    the chapter declares: the compile ``test_every_cu_compiles_for_hopper`` makes, which NVRTC's cache then serves
    to each test (a template instance's code does not depend on which others share its compile)."""
    from studylog import cuda
    compiled = cuda.compile_source("ternary_w2a8", arch="sm_90", name_expressions=cuda.INSTANCES["ternary_w2a8"])
    report = compiled.ptxas_report()
    mangled = [compiled.lowered_names[i] for i in instances]
    return "\n".join(compiled.ptx_function(m) for m in mangled), {m: report[m] for m in mangled}


# ------------------------------------------------------------------------------------------------
# Steps 15 to 17: CUDA C++ on mma.sync (compiled and checked here; run on the GPU)
# ------------------------------------------------------------------------------------------------

def test_2bit_tiles_is_the_mma_words_reordered(rng):
    n, k = 37, 600  # 3 tiles (the last one 5 rows + 11 of padding), 3 groups (the last one part padding)
    w = ternary(n, k, rng)
    mma, tiles = T.pack_2bit_mma(w), T.pack_2bit_tiles(w)
    groups = mma.shape[1] // T.GROUP_WORDS
    assert tiles.shape == (3, 16 * 16 * groups)
    for tile in range(3):
        for gi in range(groups):
            for h in range(2):
                for g in range(8):
                    row = 16 * tile + 8 * h + g
                    got = tiles[tile, ((gi * 2 + h) * 8 + g) * 16:][:16]
                    want = mma[row, gi * 16:][:16] if row < n else torch.full((16,), T.ZERO_WORD - 2**32)
                    assert torch.equal(got, want.to(torch.int32)), (tile, gi, h, g)


def _cu_constants(bf16: bool) -> tuple[int, list[int], list[int]]:
    """(magic, mul[p], add[p]) of the decode in ternary_common.cuh (steps 15 to 21), read from the source:
    the magic of with_magic, decode_pair and step 21's kernel (all three must agree), the FMA's factors."""
    import re
    from studylog import cuda
    src = cuda.read_source("ternary_common.cuh")
    magics = {int(v, 16) for v in re.findall(r"BF16 \? (0x[0-9A-Fa-f]+)u : 0x", src)} if bf16 else \
        {int(v, 16) for v in re.findall(r"BF16 \? 0x[0-9A-Fa-f]+u : (0x[0-9A-Fa-f]+)u", src)}
    magics |= {int(v, 16) for v in re.findall(r"BF16 \? (0x[0-9A-Fa-f]+)u : (0x[0-9A-Fa-f]+)u",
                                             cuda.read_source("ternary_bulk"))[0][0 if bf16 else 1:][:1]}
    assert len(magics) == 1, f"the sources disagree on the magic: {sorted(map(hex, magics))}"
    body = src.split("decode_fma(u32 v, int p)")[1].split("return w;")[0]
    body = body.split("} else {")[0 if bf16 else 1]
    mul = [int(v, 16) for v in re.findall(r"0x[0-9A-Fa-f]+", re.search(r"mul = (.*);", body).group(1))]
    add = [int(v, 16) for v in re.findall(r"0x[0-9A-Fa-f]+", re.search(r"add = (.*);", body).group(1))]
    return magics.pop(), mul, add


@pytest.mark.parametrize("bf16", [True, False])
def test_steps_15_to_21_decode_constants_give_every_weight_exactly(bf16):
    # decode_pair of the .cu file, emulated: OR the magic, AND field p with the magic, then the packed
    # FMA (exact here: every product and sum is a small integer times a power of two). A wrong
    # constant in the source fails this test without a GPU.
    dtype = torch.bfloat16 if bf16 else torch.float16
    magic, mul, add = _cu_constants(bf16)
    assert len(mul) == len(add) == 4
    codes = torch.cartesian_prod(*[torch.arange(3)] * 4)  # (81, 4): pairs 0..3 of a half
    half = (codes << (2 * torch.arange(4))).sum(1)
    for p in range(4):
        bits = (half | (magic & 0xFFFF)) & ((3 << (2 * p)) | (magic & 0xFFFF))
        value = bits.to(torch.int16).view(dtype).double()
        factor = torch.tensor([mul[p] & 0xFFFF], dtype=torch.int32).to(torch.int16).view(dtype).double()
        offset = torch.tensor([add[p] & 0xFFFF], dtype=torch.int32).to(torch.int16).view(dtype).double()
        assert mul[p] >> 16 == mul[p] & 0xFFFF and add[p] >> 16 == add[p] & 0xFFFF  # both halves alike
        assert torch.equal(value * factor + offset, codes[:, p].double() - 1), (dtype, p)


def test_steps_15_to_17_compile_to_mma_sync_without_spills():
    from studylog import cuda
    compiled = cuda.compile_source("ternary_mma", arch="sm_90", name_expressions=T.CUDA_MMA_INSTANCES)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in compiled.ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in compiled.ptx
    assert "ld.global.nc.L1::no_allocate.v4.u32" in compiled.ptx  # weights: 16 bytes, around L1
    report = compiled.ptxas_report()
    assert len(report) == len(T.CUDA_MMA_INSTANCES) == 16  # x from L2 (steps 15, 16) or shared memory (step 17)
    for name, r in report.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (name, r)
    # X_SMEM is the one difference: step 17's instances read x from shared memory, steps 15 and 16's from L2
    for name in T.CUDA_MMA_INSTANCES:
        ptx = compiled.ptx_function(compiled.lowered_names[name])
        x_smem = name.endswith("true>")
        assert ("ld.shared.v4.u32" in ptx) == x_smem and "ld.global.nc.v4.u32" in ptx, name  # (17: the copy's loads)


@pytest.mark.parametrize("m, n, k", [(1, 4096, 14336), (1, 8192, 28672), (16, 4096, 14336), (3, 17, 1), (1, 1, 1)])
def test_steps_16_and_17_launch_heuristic(m, n, k):
    cfg = T.cuda_mma_config(m, n, k, sms=132)
    groups = -(-k // 256)
    assert 1 <= cfg.slices <= groups
    rows_x = min(m, 8 if m <= 8 else 16)
    per_slice = min(-(-groups // cfg.slices), T.cuda_mma_max_groups_per_slice(rows_x))
    assert T.cuda_mma_smem_bytes(rows_x, per_slice) <= T.CUDA_MMA_SMEM_LIMIT
    if (m, n, k) == (1, 4096, 14336):  # 16 blocks of 256 rows, K in 8 slices: the best of the H200 sweep
        assert (cfg.rows, cfg.slices) == (256, 8)


@pytest.mark.parametrize("step", range(15, 26))
def test_steps_15_to_25_bad_inputs_raise_clear_errors(step, rng):
    config_type, other = {**{n: ("CudaMmaConfig", T.TmaConfig()) for n in (15, 16, 17)},
                          **{n: ("TmaConfig", T.W2A8Config()) for n in (18, 19, 20, 21)},
                          **{n: ("W2A8Config", T.TmaConfig()) for n in (22, 23)},
                          **{n: ("W2A8TilesConfig", T.W2A8Config()) for n in (24, 25)}}[step]
    matmul = T.CHAPTER.steps[step - 1].function
    w = ternary(20, 300, rng)
    tiles = T.PackedTernary.pack(w.to(DEV), "2bit_tiles")
    x = torch.randn(2, 300).to(DEV, torch.bfloat16)
    with pytest.raises(TypeError, match="x must be one of"):
        matmul(x.float(), tiles)
    with pytest.raises(ValueError, match="reads the 2bit_tiles format"):
        matmul(x, T.PackedTernary.pack(w.to(DEV), "2bit_mma"))
    with pytest.raises(ValueError, match="K=301"):
        matmul(torch.randn(2, 301).to(DEV, torch.bfloat16), tiles)
    for wrong in ({"warps": 4}, other):
        with pytest.raises(TypeError, match=config_type):
            matmul(x, tiles, config=wrong)
    with pytest.raises(ValueError, match=r"need \(3, 512\)"):
        T.PackedTernary(tiles.data, 33, 300, "2bit_tiles")  # 33 rows take 3 tiles, not 2
    if not runtime.has_gpu():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            matmul(x, tiles)


def test_cuda_configs_refuse_what_is_not_compiled():
    with pytest.raises(ValueError, match="row_tiles"):
        T.CudaMmaConfig(row_tiles=3)
    with pytest.raises(ValueError, match="slices"):
        T.CudaMmaConfig(slices=0)
    with pytest.raises(ValueError, match="row_tiles, stages, chunk"):
        T.TmaConfig(row_tiles=3)
    with pytest.raises(ValueError, match="warps"):
        T.TmaConfig(warps=3)
    with pytest.raises(ValueError, match="slices"):
        T.TmaConfig(slices=0)
    with pytest.raises(ValueError, match="row_tiles, stages, chunk"):
        T.W2A8Config(row_tiles=3)
    assert T.W2A8Config(row_tiles=4).rows == 64  # compiled for steps 22 and 23, not for 18 to 21
    with pytest.raises(ValueError, match="row_tiles, stages, chunk"):
        T.TmaConfig(row_tiles=4)


STEP17_CONFIGS = [T.CudaMmaConfig(rt, 2, warps, slices) for rt in (1, 2) for warps in (1, 4, 8) for slices in (1, 3, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 17, 300), (3, 130, 2000), (8, 33, 256), (9, 77, 513),
                                     (16, 300, 5000), (17, 40, 777), (40, 200, 1000)])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_gpu_steps_15_to_17_every_config(m, n, k, x_dtype):
    """Steps 15 to 17 against float64 at every config, twice (the arrival counters left at zero); step 16 and
    step 17 at the same config add the same products in the same order (x from L2 or from shared memory): the
    same bits."""
    gen = torch.Generator(device="cuda").manual_seed(m * 1000 + n + k)
    w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda", generator=gen), per_channel=(k % 2 == 1))
    x = torch.randn(m, k, device="cuda", generator=gen).to(x_dtype)
    tiles = T.PackedTernary.pack(w, "2bit_tiles")
    assert_matches(T.step15_cuda_mma(x, tiles, scale, out=poisoned(m, n)), x, w, scale)
    for cfg in [None] + STEP17_CONFIGS:
        z = T.step17_x_smem(x, tiles, scale, out=poisoned(m, n), config=cfg)
        assert_matches(z, x, w, scale)
        again = T.step17_x_smem(x, tiles, scale, config=cfg)  # the arrival counters were left at zero
        assert torch.equal(z, again), f"{cfg}: not deterministic"
        from_l2 = T.step16_split_k(x, tiles, scale, out=poisoned(m, n), config=cfg)
        assert_matches(from_l2, x, w, scale)
        if cfg is not None and -(-k // 256) <= T.cuda_mma_max_groups_per_slice(min(m, 16)) * cfg.slices:  # same K slices
            assert torch.equal(from_l2, z), f"{cfg}: step 16 differs from step 17"


@pytest.mark.gpu
def test_gpu_step17_full_size_unaligned_x_and_the_dispatcher():
    gen = torch.Generator(device="cuda").manual_seed(8)
    n, k = 4099, 14335
    w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda", generator=gen))
    tiles = T.PackedTernary.pack(w, "2bit_tiles")
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        assert_matches(T.ternary_matmul(x, tiles, scale), x, w, scale)
    wide = torch.randn(2, k + 1, device="cuda", generator=gen).to(torch.bfloat16)
    x = wide[:, 1:]  # rows start 2 bytes past a 16-byte boundary: the wrapper copies them
    assert_matches(T.step17_x_smem(x, tiles, scale, out=poisoned(2, n)), x, w, scale)
    assert_matches(T.step17_x_smem(x[0], tiles, scale)[None], x[:1], w, scale)
    for step in (T.step15_cuda_mma, T.step16_split_k):
        assert_matches(step(x, tiles, scale, out=poisoned(2, n)), x, w, scale)


# ------------------------------------------------------------------------------------------------
# Steps 18 to 21: step 17 fed by the TMA (compiled and checked here; run on a Hopper GPU)
# ------------------------------------------------------------------------------------------------

def test_steps_18_to_21_compile_to_bulk_copies_and_mbarriers_without_spills():
    from studylog import cuda
    instances = T.TMA_INSTANCES + T.TMA_RING_INSTANCES
    compiled = cuda.compile_source("ternary_bulk", arch="sm_90", name_expressions=instances)
    ptx = compiled.ptx
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx  # the copy engine
    assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive.expect_tx" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    import re
    assert not re.search(r"ld\.global[.\w:]*\.v[24]", ptx)  # no vector loads: weights and x come by the engine
    report = compiled.ptxas_report()
    assert len(report) == len(instances)
    for name, r in report.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (name, r)
    # WARP_COPIES (steps 18, 19): one copy a consumer warp, in a loop; step 20's one copy a tile has no such loop
    copies = {name: compiled.ptx_function(compiled.lowered_names[name]).count("cp.async.bulk.shared::cluster")
              for name in T.TMA_RING_INSTANCES}
    assert all(n >= 1 for n in copies.values()), copies


def test_step21_decode_keeps_the_magic_in_a_register():
    """The point of decode_pair_reg: no IMAD.MOV of the magic before each LOP3 (read from the SASS)."""
    import re, shutil, subprocess, tempfile
    from pathlib import Path
    from studylog import cuda
    tool = Path(__import__("triton").__file__).parent / "backends/nvidia/bin/cuobjdump"
    if not tool.is_file() and not shutil.which("cuobjdump"):
        pytest.skip("no cuobjdump to read SASS with")
    counts = {}
    for step, source, name in [(17, "ternary_mma", "cuda_mma_kernel<true, 1, 1, 2, true>"),
                               (20, "ternary_bulk", "tma_kernel<true, 1, 1, 4, 1, false, false>"),
                               (21, "ternary_bulk", "tma_kernel<true, 1, 1, 4, 1, false, true>")]:
        cubin = cuda.compile_source(source, arch="sm_90", name_expressions=[name]).cubin
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([str(tool) if tool.is_file() else "cuobjdump", "-sass", f.name],
                                  capture_output=True, text=True, check=True).stdout
        magic_moves = len(re.findall(r"IMAD\.MOV\.U32 R\d+, RZ, RZ, 0x43004300", sass))
        counts[step] = (magic_moves, sass.count("0x43004300"), sass.count("HMMA"))
    # the constant: everywhere in steps 17 and 20, once in 21; an IMAD.MOV of it before LOP3s in 17 and 20, none in 21
    assert counts[17][1] >= 16 and counts[20][1] >= 16 and counts[21][1] <= 2, counts
    assert counts[17][0] >= 16 and counts[20][0] >= 16 and counts[21][0] == 0, counts


@pytest.mark.parametrize("m, n, k", [(1, 4096, 14336), (1, 8192, 28672), (1, 14336, 4096), (8, 2560, 6912),
                                     (16, 4096, 14336), (3, 17, 1), (1, 1, 1)])
def test_steps_19_to_21_launch_heuristic_fits_shared_memory(m, n, k):
    cfg = T.tma_config(m, n, k, sms=132)
    groups, rows_x = -(-k // 256), min(m, 8 if m <= 8 else 16)
    per_slice = min(-(-groups // cfg.slices), T.tma_max_groups_per_slice(cfg, rows_x))
    assert T.tma_smem_bytes(cfg, rows_x, per_slice) <= T.SMEM_LIMIT
    if m == 1 and k <= 28672:  # all of x in one block: K is not split across blocks
        assert -(-groups // per_slice) == 1
    best_on_the_h200 = {(1, 4096, 14336): (1, 8), (1, 8192, 28672): (2, 4), (1, 14336, 4096): (1, 4)}
    if (m, n, k) in best_on_the_h200:
        assert (cfg.row_tiles, cfg.warps) == best_on_the_h200[m, n, k]


STEP21_CONFIGS = [T.TmaConfig(rt, warps, st, ch, slices) for (rt, st, ch) in T.TMA_SHAPES
                 for warps in (1, 4, 8) for slices in (1, 3)] + [T.TmaConfig(1, 16, 4, 1, 1), T.TmaConfig(1, 16, 4, 2, 2)]


def _gpu_is_hopper() -> bool:
    return runtime.has_gpu() and torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 17, 300), (3, 130, 2000), (8, 33, 256), (9, 77, 513),
                                     (16, 300, 5000), (17, 40, 777), (1, 50, 7)])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_gpu_step21_every_config(m, n, k, x_dtype):
    if not _gpu_is_hopper():
        pytest.skip("step 21 needs a Hopper GPU (the TMA)")
    gen = torch.Generator(device="cuda").manual_seed(m * 1000 + n + k)
    w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda", generator=gen), per_channel=(k % 2 == 1))
    x = torch.randn(m, k, device="cuda", generator=gen).to(x_dtype)
    tiles = T.PackedTernary.pack(w, "2bit_tiles")
    for cfg in [None] + STEP21_CONFIGS:
        if cfg is not None and cfg.warps > 8 and m > 8:
            with pytest.raises(ValueError, match="more than 8 warps"):
                T.step21_magic_reg(x, tiles, scale, config=cfg)
            continue
        z = T.step21_magic_reg(x, tiles, scale, out=poisoned(m, n), config=cfg)
        assert_matches(z, x, w, scale)
        again = T.step21_magic_reg(x, tiles, scale, config=cfg)  # the arrival counters were left at zero
        assert torch.equal(z, again), f"{cfg}: not deterministic"


STEP18_CONFIGS = [T.TmaConfig(rt, warps, 4, 1, slices) for rt in (1, 2) for warps in (1, 4, 8) for slices in (1, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 17, 300), (3, 130, 2000), (8, 33, 256), (9, 77, 513),
                                     (16, 300, 5000), (1, 50, 7)])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_gpu_steps_18_to_20_every_config_equal_step21(m, n, k, x_dtype):
    """Steps 18 to 20 against float64 at their defaults and at every config of their compiled shapes; each is
    step 21 with a change undone that keeps its order of the sums, so at M <= 8 (one tile of x a block, as
    step 21's) and the same config it gives step 21's bits."""
    if not _gpu_is_hopper():
        pytest.skip("steps 18 to 21 need a Hopper GPU (the TMA)")
    gen = torch.Generator(device="cuda").manual_seed(m * 1000 + n + k + 18)
    w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda", generator=gen), per_channel=(k % 2 == 1))
    x = torch.randn(m, k, device="cuda", generator=gen).to(x_dtype)
    tiles = T.PackedTernary.pack(w, "2bit_tiles")
    steps = (T.step18_tma_ring, T.step19_shared_k, T.step20_tile_copies)
    for step in steps:
        assert_matches(step(x, tiles, scale, out=poisoned(m, n)), x, w, scale)
    for cfg in STEP18_CONFIGS:
        want = T.step21_magic_reg(x, tiles, scale, config=cfg)
        for step in steps:
            z = step(x, tiles, scale, out=poisoned(m, n), config=cfg)
            assert_matches(z, x, w, scale)
            if m <= 8:
                assert torch.equal(z, want), f"{step.__name__} at {cfg}: differs from step 21"
    with pytest.raises(ValueError, match="compiled for"):
        T.step20_tile_copies(x, tiles, scale, config=T.TmaConfig(1, 4, 8, 1, 1))


@pytest.mark.gpu
def test_gpu_step21_full_size_unaligned_x_and_the_dispatcher():
    if not _gpu_is_hopper():
        pytest.skip("step 21 needs a Hopper GPU (the TMA)")
    gen = torch.Generator(device="cuda").manual_seed(9)
    for n, k in [(4099, 14335), (8192, 28672)]:
        w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda", generator=gen))
        tiles = T.PackedTernary.pack(w, "2bit_tiles")
        for m in (1, 5, 16):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            assert_matches(T.step21_magic_reg(x, tiles, scale, out=poisoned(m, n)), x, w, scale)
            assert_matches(T.ternary_matmul(x, tiles, scale), x, w, scale)
    wide = torch.randn(2, k + 1, device="cuda", generator=gen).to(torch.bfloat16)
    x = wide[:, 1:]  # rows start 2 bytes past a 16-byte boundary: the wrapper copies them
    assert_matches(T.step21_magic_reg(x, tiles, scale, out=poisoned(2, n)), x, w, scale)
    assert_matches(T.step21_magic_reg(x[0], tiles, scale)[None], x[:1], w, scale)


@pytest.mark.gpu
def test_gpu_step21_probes_run():
    """The BULK_PROBE builds the benchmark times (copies only, arithmetic only, launch only) launch."""
    if not _gpu_is_hopper():
        pytest.skip("step 21 needs a Hopper GPU (the TMA)")
    w, scale = T.quantize_absmean(torch.randn(64, 1024, device="cuda"))
    tiles = T.PackedTernary.pack(w, "2bit_tiles")
    x = torch.randn(1, 1024, device="cuda").to(torch.bfloat16)
    for probe in (1, 2, 3):
        T.step21_probe(x, tiles, scale, probe)()
    torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------
# Steps 22 and 23: W2A8 (int8 x, the int8 MMA on the 2bit_tiles words) on step 21's plumbing
# ------------------------------------------------------------------------------------------------

def test_steps_22_and_23_compile_to_int8_mma_and_bulk_copies_without_spills():
    import re, shutil, subprocess, tempfile
    from pathlib import Path
    from studylog import cuda
    ptx, report = w2a8_compiled(T.W2A8_QUANTIZE_INSTANCES + T.W2A8_INSTANCES)
    assert "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32" in ptx
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "fma.rn.bf16x2" not in ptx  # no float decode: the codes go to the tensor cores as they are
    assert "griddepcontrol.launch_dependents" in ptx and "griddepcontrol.wait" in ptx  # the early launch
    # the weights come by the engine; after quantize_x the consumers load int8 x themselves, 16 bytes
    # at a time through L2 (.cg: another kernel's bytes), and nothing else in 16-byte loads
    separate = [i for i in T.W2A8_INSTANCES if i.startswith(f"w2a8_kernel<{int(T.Quant.SEPARATE)},")]
    matmul_only, _ = w2a8_compiled(separate)
    assert set(re.findall(r"ld\.global[.\w:]*\.v[24]\.\w+", matmul_only)) == {"ld.global.cg.v4.u32"}
    assert len(report) == len(T.W2A8_QUANTIZE_INSTANCES + T.W2A8_INSTANCES)
    for name, r in report.items():  # what w2a8_blocks_per_sm counts on (8 rows of x a block)
        args = re.search(r"w2a8_kernelILi(\d)ELb(\d)ELi(\d)ELi(\d)E", name)
        if args and args.group(3) == "1":
            assert r["registers"] <= (96 if int(args.group(4)) <= 2 else 136), (name, r)
    for name, r in report.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (name, r)
    tool = Path(__import__("triton").__file__).parent / "backends/nvidia/bin/cuobjdump"
    if not tool.is_file() and not shutil.which("cuobjdump"):
        pytest.skip("no cuobjdump to read SASS with")
    cubin = cuda.compile_source("ternary_w2a8", arch="sm_90",
                                name_expressions=["w2a8_kernel<0, true, 1, 1, 4, 1>"]).cubin
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tool) if tool.is_file() else "cuobjdump", "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
    # a group: 8 int8 MMAs, each fed by 4 ANDs (one a register of 4 codes), in the SASS as written
    assert sass.count("IMMA.16832.U8.S8") == 8 and "HMMA" not in sass
    for mask in ("0x3030303", "0xc0c0c0c", "0x30303030", "0xc0c0c0c0"):
        assert len(re.findall(rf"LOP3\.LUT R\d+, R\d+, {mask}, RZ", sass)) == 8, mask


def test_step22_x_order_is_a_permutation_of_each_group():
    order = w2a8_x_order(300)
    assert order.shape == (512,)
    assert torch.equal(order.sort().values, torch.arange(512))
    assert torch.equal(order[:256] + 256, order[256:])


@pytest.mark.parametrize("n, k", [(16, 256), (5, 300), (33, 777)])
def test_step22_fragments_emulated_on_the_cpu_give_the_product(n, k, rng):
    """The kernel's data flow in torch, from the mma.m16n8k32 fragment layout (PTX ISA): for each
    group, code p' of word 4 t + 2 q (+ 1) of rows g, g + 8 meets the B registers 2 q (+ 1) of xv[p'],
    in the order of w2a8_x_order. Summed over every step it must be sum_k x_k (w_k + 1)."""
    w = ternary(n, k, rng)
    x = torch.randint(-128, 128, (k,), generator=rng)
    words = T.PackedTernary.pack(w, "2bit_tiles").data.long() & 0xFFFFFFFF
    tiles, groups = words.shape[0], words.shape[1] // 256
    words = words.view(tiles, groups, 2, 8, 16)  # [tile, group, half h, row g, word]
    xk = torch.zeros(groups * 256, dtype=torch.long)
    xk[:k] = x
    xb = xk[w2a8_x_order(k)].view(groups, 4, 4, 4, 4)  # [group, p', t, i, byte j]
    total = torch.zeros(tiles, 16, dtype=torch.long)
    for p in range(4):
        for q in range(2):
            for col in range(32):  # the MMA's k: (a0, a1) columns 4 t + j, (a2, a3) 16 + 4 t + j
                t, j, half = (col % 16) // 4, col % 4, col // 16
                word = words[:, :, :, :, 4 * t + 2 * q + half]  # [tile, group, h, g]
                code = (word >> (8 * j + 2 * p)) & 3
                xv = xb[:, p, t, 2 * q + half, j]  # [group]
                total += (code * xv[None, :, None, None]).sum(1).reshape(tiles, 16)
    expect = (w.long() + 1) @ x
    assert torch.equal(total.view(-1)[:n], expect)


@pytest.mark.parametrize("m, n, k", [(1, 4096, 14336), (1, 8192, 28672), (1, 14336, 4096), (8, 2560, 6912),
                                     (16, 4096, 14336), (3, 17, 1), (1, 1, 1), (1, 10, 131072)])
def test_steps_22_and_23_launch_heuristic_fits_shared_memory(m, n, k):
    cfg = T.w2a8_config(m, n, k, sms=132)
    assert isinstance(cfg, T.W2A8Config)
    # what a call launches (bf16 and fp16 x alike): a compiled instance, within shared memory
    quant, planned = T.w2a8_choose(m, n, k, None, None, 132)
    planned_slice, grid = T.w2a8_grid(m, n, k, planned, fused=quant != T.Quant.SEPARATE)
    smem = T.w2a8_smem_bytes(planned, min(m, 8 if m <= 8 else 16), planned_slice, staged=quant == T.Quant.STAGED)
    assert T.w2a8_refusal(m, k, quant, planned) is None and smem <= T.SMEM_LIMIT
    assert quant == T.W2A8_QUANTIZE[T.w2a8_default_quantize(m, n, k, 132)]
    if m == 1 and T.W2A8_STAGED_MIN_K <= k <= 32768:  # one long row of x: staged (no wave lost at these shapes)
        assert quant == T.Quant.STAGED and smem == T.w2a8_smem_bytes(planned, 1, -(-k // 256), staged=True)
    if m == 1 and k < T.W2A8_STAGED_MIN_K and T.w2a8_takes(m, n, k, "every block", sms=132):  # a short row
        assert quant == T.Quant.EVERY_BLOCK
    assert grid[0] * planned.rows >= n and grid[2] * (8 if m <= 8 else 16) >= m
    groups, rows_x = -(-k // 256), min(m, 8 if m <= 8 else 16)
    per_slice = min(-(-groups // cfg.slices), T.w2a8_max_groups_per_slice(cfg, rows_x))
    assert T.w2a8_smem_bytes(cfg, rows_x, per_slice, staged=quant == T.Quant.STAGED) <= T.SMEM_LIMIT
    if m == 1 and k <= 28672:
        assert -(-groups // per_slice) == 1
        for where in ("separate", "every block"):
            c = T.w2a8_config(m, n, k, sms=132, quantize=where)
            per_block = T.w2a8_smem_bytes(c, 1, groups)
            assert per_block <= T.SMEM_LIMIT
            # one wave: every block resident at once
            assert -(-(-(-n // 16)) // c.row_tiles) <= 132 * T.w2a8_blocks_per_sm(c, 1, groups), (where, c)
    # the fastest on the H200 in the sweeps (kernel time, M = 1): (after quantize_x, every block)
    best_on_the_h200 = {(1, 4096, 14336): ((1, 8), (1, 8)), (1, 8192, 28672): ((2, 8), (2, 8)),
                        (1, 14336, 4096): (None, (2, 4)), (1, 2560, 2560): (None, (1, 8))}
    for where, best in zip(("separate", "every block"), best_on_the_h200.get((m, n, k), (None, None))):
        if best:
            c = T.w2a8_config(m, n, k, sms=132, quantize=where)
            assert (c.row_tiles, c.warps) == best, (where, c)


def test_steps_22_to_25_refuse_a_k_past_exact_int32_sums(rng):
    w = ternary(3, T.W2A8_MAX_K + 1, rng)
    tiles = T.PackedTernary.pack(w.to(DEV), "2bit_tiles")
    x = torch.zeros(1, T.W2A8_MAX_K + 1).to(DEV, torch.bfloat16)
    for step in (T.step22_w2a8, T.step23_w2a8_fused, T.step24_w2a8_tiles, T.step25_x_tma):
        with pytest.raises((ValueError, RuntimeError), match="K <= 131072|needs a CUDA GPU"):
            step(x, tiles)
    with pytest.raises(ValueError, match="at most 8 rows of x"):
        T.w2a8_choose(16, 4096, 14336, None, "every block", 132)
    with pytest.raises(ValueError, match="no compiled instance"):
        T.w2a8_choose(16, 4096, 14336, T.W2A8Config(4, 8, 4, 1, 1), None, 132)


def test_step23_staged_x_comes_by_the_copy_engine():
    """quantize="staged": the producer's copy engine brings x (no 16-byte loads of x by the consumers: only
    the last K % 8 activations of a row, one by one), ahead of the weights, and nothing spills."""
    import re
    staged = [i for i in T.W2A8_INSTANCES if i.startswith(f"w2a8_kernel<{int(T.Quant.STAGED)},")]
    assert len(staged) == 2 * len(T.W2A8_STAGED_SHAPES)
    ptx, report = w2a8_compiled(staged)
    assert not re.findall(r"ld\.global[.\w:]*\.v[24]\.\w+", ptx)
    assert "ld.global.nc.u16" in ptx  # the tail of a row
    assert "createpolicy.fractional.L2::evict_last" in ptx  # x: every block reads it
    assert "bar.arrive 2" not in ptx and "bar.sync 2" not in ptx  # no pause of the weights for x
    for name, r in report.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (name, r)


@pytest.mark.parametrize("m, n, k", [(1, 4096, 14336), (1, 8192, 28672), (1, 14336, 4096), (1, 2560, 2560),
                                     (1, 13824, 2560), (1, 2560, 6912), (1, 20480, 3200), (3, 130, 2000)])
def test_step23_staged_launch(m, n, k):
    """The staged launch: room for 16-bit x (which its int8 bytes overwrite) beside its ring; one block an
    SM with the fewest row tiles that give at least 3/4 of the SMs a block, else every block's launch. The
    default for one row of x wherever it fits."""
    quant, cfg = T.w2a8_choose(m, n, k, None, "staged", 132)
    per_slice, grid = T.w2a8_grid(m, n, k, cfg, fused=True)
    smem = T.w2a8_smem_bytes(cfg, m, per_slice, staged=True)
    groups = -(-k // 256)
    assert quant == T.Quant.STAGED and T.w2a8_refusal(m, k, quant, cfg) is None
    assert per_slice == groups and grid[1] == 1 and grid[0] * cfg.rows >= n
    assert smem == T.w2a8_smem_bytes(cfg, m, groups, staged=True) <= T.SMEM_LIMIT
    assert smem >= cfg.stages * cfg.stage_bytes + m * k * 2  # the 16-bit rows fit
    assert groups <= T.W2A8_STAGED_GROUPS_PER_WARP * cfg.warps
    blocks, tiles = grid[0], -(-n // 16)
    assert cfg.stages == 4
    fill = [rt for rt in (1, 2, 4) if 99 <= -(-tiles // rt) <= 132]
    if fill:  # a block an SM, and no fewer row tiles a block would do
        assert cfg.row_tiles == fill[0] and 99 <= blocks <= 132
    else:  # every block's launch
        every = T.w2a8_config(m, n, k, 132, quantize="every block")
        assert (cfg.row_tiles, cfg.warps) == (every.row_tiles, every.warps)
    if (m, n, k) == (1, 4096, 14336):  # 128 blocks of 2 tiles
        assert (cfg.row_tiles, cfg.warps, cfg.stages, blocks) == (2, 8, 4, 128)
    if (m, n, k) == (1, 8192, 28672):  # 128 blocks of 4 tiles
        assert (cfg.row_tiles, cfg.warps, cfg.stages, blocks) == (4, 8, 4, 128)
    assert T.w2a8_default_quantize(m, n, k, 132) == ("staged" if m == 1 and k >= T.W2A8_STAGED_MIN_K else "every block")


@pytest.mark.parametrize("n, k", [(5120, 27648), (4096, 14336), (13824, 2560), (20480, 3200), (8192, 28672)])
def test_step23_stages_x_only_where_it_costs_no_wave(n, k):
    """One row of x: staged x (K in 16 bits) leaves fewer blocks an SM; where its grid then needs more waves than
    every block's, the default quantises in every block (BitNet's 5120 x 27648 on 132 SMs: 160 blocks, one an
    SM staged, two unstaged)."""
    waves = {where: T.w2a8_waves(1, n, k, where, 132) for where in ("staged", "every block")}
    for where, cfg in ((w, T.w2a8_config(1, n, k, 132, quantize=w)) for w in waves):
        blocks = T.w2a8_grid(1, n, k, cfg, fused=True)[1][0]
        per_sm = T.w2a8_blocks_per_sm(cfg, 1, -(-k // 256), staged=where == "staged")
        assert (waves[where] - 1) * 132 * per_sm < blocks <= waves[where] * 132 * per_sm
    expect = "staged" if waves["staged"] <= waves["every block"] and k >= T.W2A8_STAGED_MIN_K else "every block"
    assert T.w2a8_default_quantize(1, n, k, 132) == expect
    assert (n, k) != (5120, 27648) or expect == "every block"
    assert (n, k) != (4096, 14336) or expect == "staged"


def test_step23_staged_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="holds a row of x in its consumers' registers: K <= 16384 with 4"):
        T.w2a8_choose(1, 4096, 28672, T.W2A8Config(2, 4, 4, 1), "staged", 132)
    with pytest.raises(ValueError, match="compiled for"):
        T.w2a8_choose(1, 4096, 4096, T.W2A8Config(1, 8, 4, 2), "staged", 132)
    with pytest.raises(ValueError, match="'staged' needs all of K in shared memory, as 16-bit x"):
        T.w2a8_choose(8, 4096, 28672, T.W2A8Config(1, 8, 4, 1), "staged", 132)
    with pytest.raises(ValueError, match="at most 8 rows of x"):
        T.w2a8_choose(9, 4096, 512, None, "staged", 132)
    with pytest.raises(ValueError, match="no compiled instance"):  # a staged-only shape, quantised elsewhere
        T.w2a8_choose(1, 4096, 4096, T.W2A8Config(2, 8, 3, 1), "every block", 132)
    # with no place asked for, a config that staging cannot take gets the next default
    assert T.w2a8_choose(1, 17, 300, T.W2A8Config(1, 1, 4, 2), None, 132)[0] == T.Quant.EVERY_BLOCK
    assert T.w2a8_choose(1, 4096, 8192, T.W2A8Config(1, 1, 4, 1), None, 132)[0] == T.Quant.EVERY_BLOCK  # K past 1 warp's 4096
    assert T.w2a8_choose(1, 17, 12288, T.W2A8Config(1, 8, 4, 1), None, 132)[0] == T.Quant.STAGED  # a long row
    assert T.w2a8_choose(1, 17, 300, T.W2A8Config(1, 1, 4, 1), None, 132)[0] == T.Quant.EVERY_BLOCK  # a short one
    with pytest.raises(ValueError, match="no quantize given"):  # a staged-only shape, 2 rows of x: every block's
        T.w2a8_choose(2, 4096, 4096, T.W2A8Config(2, 8, 3, 1), None, 132)


STEP23_CONFIGS = [T.W2A8Config(rt, warps, st, ch, slices) for (rt, st, ch) in T.W2A8_SHAPES
                  for warps in (1, 4, 8) for slices in (1, 3)]


def assert_matches_w2a8(z, x, w, scale):
    """Steps 22 to 25 against float64 on their own inputs: x quantised as quantize_activations does."""
    assert not torch.isnan(z).any(), "the kernel left outputs unwritten (NaN poison survived)"
    xq, x_scale = T.quantize_activations(x.float())
    xq64, s64 = xq.double(), F.as_scale64(scale, x.device)
    ref = (xq64 @ w.double().T) / (x_scale.double()[:, None] * s64)
    magnitude = (xq64.abs() @ w.double().abs().T) / (x_scale.double()[:, None] * s64.abs())
    ratio = F.error_ratio_from(z, ref, magnitude)
    assert ratio <= TOL, f"max error is {ratio:.2e} of sum |x_q||w|; tolerance {TOL:.0e}"


def step22_inputs(m, n, k, x_dtype, seed, device="cuda"):
    """Fresh ternary weights (a per-channel scale for odd K), their 2bit_tiles packing and x of 3 randn."""
    gen = torch.Generator(device=device).manual_seed(seed)
    w, scale = T.quantize_absmean(torch.randn(n, k, device=device, generator=gen), per_channel=(k % 2 == 1))
    x = (3 * torch.randn(m, k, device=device, generator=gen)).to(x_dtype)
    return w, scale, x, T.PackedTernary.pack(w, "2bit_tiles")


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 17, 300), (3, 130, 2000), (8, 33, 256), (9, 77, 513),
                                     (16, 300, 5000), (17, 40, 777), (1, 50, 7)])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_gpu_steps_22_and_23_every_config(m, n, k, x_dtype):
    if not _gpu_is_hopper():
        pytest.skip("steps 22 and 23 need a Hopper GPU (the TMA)")
    w, scale, x, tiles = step22_inputs(m, n, k, x_dtype, seed=m * 1000 + n + k)
    # the first kernel: quantize_activations' bytes and scales, bit for bit, in the MMA's order
    xq, x_scale, row_sum = T.w2a8_quantize(x)
    want_q, want_scale = T.quantize_activations(x.float())
    order = w2a8_x_order(k, device="cuda")
    padded = torch.zeros(m, order.numel(), dtype=torch.int8, device="cuda")
    padded[:, :k] = want_q
    assert torch.equal(xq, padded[:, order]) and torch.equal(x_scale, want_scale)
    assert torch.equal(row_sum, want_q.int().sum(1, dtype=torch.int32))
    for cfg in [None] + STEP23_CONFIGS:
        if cfg is not None and m > 8 and cfg.row_tiles == 4:
            with pytest.raises(ValueError, match="no compiled instance"):
                T.step23_w2a8_fused(x, tiles, scale, config=cfg)
            continue
        for where in [None, "separate"] + (["every block"] if m <= 8 else []):
            z = T.step23_w2a8_fused(x, tiles, scale, out=poisoned(m, n), config=cfg, quantize=where)
            assert_matches_w2a8(z, x, w, scale)
            again = T.step23_w2a8_fused(x, tiles, scale, config=cfg, quantize=where)
            assert torch.equal(z, again), f"{cfg}, quantize {where}: not deterministic"
            if where == "separate":  # step 22 is this launch
                assert torch.equal(T.step22_w2a8(x, tiles, scale, out=poisoned(m, n), config=cfg), z), cfg


def test_w2a8_plan_refuses_bad_arguments():
    """W2A8Plan names the argument it refuses, before it asks for a GPU."""
    w, _, _, tiles = step22_inputs(1, 20, 300, torch.bfloat16, seed=3, device="cpu")
    with pytest.raises(ValueError, match="m must be"):
        T.W2A8Plan(tiles, m=0)
    with pytest.raises(TypeError, match="dtype must be one of"):
        T.W2A8Plan(tiles, dtype=torch.float32)
    with pytest.raises(TypeError, match="w must be a PackedTernary"):
        T.W2A8Plan(w)
    if not runtime.has_gpu():
        with pytest.raises(RuntimeError, match="GPU"):
            T.W2A8Plan(tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 17, 300), (1, 509, 2001), (3, 130, 2000), (1, 127, 5003), (9, 77, 513),
                                     (1, 50, 7), (1, 1024, 14335), (None, 33, 1000)])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_gpu_w2a8_plan_equals_step23(m, n, k, x_dtype):
    """The plan launches step 23's kernel with its arguments packed once: on fresh x each call, the same bits as
    step 23 at every place for x (M > 8: "separate", two launches), x whose rows are off 16-byte boundaries
    included; a CUDA graph of one call replays on new x; x of another type or shape is refused, named."""
    if not _gpu_is_hopper():
        pytest.skip("step 23 needs a Hopper GPU (the TMA)")
    rows = m or 1
    w, scale, x, tiles = step22_inputs(rows, n, k, x_dtype, seed=rows * 7 + n + k)
    for where in [None, "separate"] + (["every block"] if rows <= 8 else []):
        plan = T.W2A8Plan(tiles, scale, m=m, dtype=x_dtype, quantize=where)
        for seed in (1, 2):  # a new x each call: the plan rewrites its address
            xi = (3 * torch.randn(rows, k, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
                  ).to(x_dtype)
            xi = xi[0] if m is None else xi
            plan.out.fill_(float("nan"))
            z = plan(xi)
            assert z is plan.out and z.shape == ((n,) if m is None else (rows, n))
            want = T.step23_w2a8_fused(xi, tiles, scale, quantize=where)
            assert torch.equal(z, want), f"quantize {where}, seed {seed}: differs from step 23"
            assert_matches_w2a8(z.reshape(rows, n), xi.reshape(rows, k), w, scale)
    with pytest.raises(TypeError, match="x must be a"):
        plan(x.float())
    with pytest.raises(ValueError, match="the plan's shape"):
        plan(torch.zeros(rows + 1, k, dtype=x_dtype, device="cuda"))
    # rows off 16-byte boundaries go through the plan's aligned copy: the same bits
    buffer = (3 * torch.randn(rows * k + 8, device="cuda")).to(x_dtype)
    odd = buffer[1:1 + rows * k].view(rows, k) if m is not None else buffer[1:1 + k]
    assert torch.equal(plan(odd), T.step23_w2a8_fused(odd, tiles, scale, quantize=where))
    # a graph of one call, replayed on x copied into the buffer it captured
    plan = T.W2A8Plan(tiles, scale, m=m, dtype=x_dtype)
    xin = torch.zeros_like(x[0] if m is None else x)
    plan(xin)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(xin)
    xin.copy_(x[0] if m is None else x)
    plan.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(plan.out, T.step23_w2a8_fused(xin, tiles, scale))


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 125, 7), (1, 250, 300), (1, 509, 2001), (3, 509, 2000), (1, 127, 5003),
                                     (8, 1024, 4000), (1, 1024, 14335), (2, 64, 4097), (1, 40, 8), (5, 33, 1000)])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_gpu_step23_staged_equals_every_block(m, n, k, x_dtype):
    """quantize="staged": x by the copy engine into shared memory, quantised there (the int8 bytes over the
    16-bit row), the weights all asked for at once. The same bytes and sums as every block quantising x
    from global memory: equal, bit for bit, for every compiled shape and warp count (K < 8: no copy at
    all; K % 8: the tail from global memory; several rows of x, whose int8 rows overlap the 16-bit ones)."""
    if not _gpu_is_hopper():
        pytest.skip("steps 22 and 23 need a Hopper GPU (the TMA)")
    w, scale, x, tiles = step22_inputs(m, n, k, x_dtype, seed=m * 11 + n + k)
    every = T.step23_w2a8_fused(x, tiles, scale, quantize="every block")
    assert_matches_w2a8(every, x, w, scale)
    groups = -(-k // 256)
    for rt, st, ch in T.W2A8_STAGED_SHAPES:
        for warps in (1, 4, 8):
            cfg = T.W2A8Config(rt, warps, st, ch)
            if groups > T.W2A8_STAGED_GROUPS_PER_WARP * warps:
                with pytest.raises(ValueError, match="holds a row of x"):
                    T.step23_w2a8_fused(x, tiles, scale, config=cfg, quantize="staged")
                continue
            if T.w2a8_smem_bytes(cfg, m, groups, staged=True) > T.SMEM_LIMIT:
                with pytest.raises(ValueError, match="all of K in shared memory"):
                    T.step23_w2a8_fused(x, tiles, scale, config=cfg, quantize="staged")
                continue
            z = T.step23_w2a8_fused(x, tiles, scale, out=poisoned(m, n), config=cfg, quantize="staged")
            assert torch.equal(z, every), f"{cfg}: differs from every block quantising x"
            again = T.step23_w2a8_fused(x, tiles, scale, config=cfg, quantize="staged")
            assert torch.equal(z, again), f"{cfg}: not deterministic"
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_gpu_step23_full_size_unaligned_x_and_probes():
    if not _gpu_is_hopper():
        pytest.skip("steps 22 and 23 need a Hopper GPU (the TMA)")
    gen = torch.Generator(device="cuda").manual_seed(10)
    for n, k in [(4099, 14335), (8192, 28672)]:
        w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda", generator=gen))
        tiles = T.PackedTernary.pack(w, "2bit_tiles")
        for m in (1, 5, 8, 16):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            # every block needs its rows of int8 x over all of K beside the stages (8 rows of K = 28672 do not fit)
            every = T.w2a8_config(m, n, k, quantize="every block")
            fits = m <= 8 and T.w2a8_smem_bytes(every, m, -(-k // 256)) <= T.SMEM_LIMIT
            staged = m <= 8 and T.w2a8_smem_bytes(T.w2a8_config(m, n, k, quantize="staged"), m, -(-k // 256),
                                                   staged=True) <= T.SMEM_LIMIT
            for where in [None, "separate"] + (["every block"] if fits else []) + (["staged"] if staged else []):
                z = T.step23_w2a8_fused(x, tiles, scale, out=poisoned(m, n), quantize=where)
                assert_matches_w2a8(z, x, w, scale)
            if m == 16:
                with pytest.raises(ValueError, match="at most 8 rows of x"):
                    T.step23_w2a8_fused(x, tiles, scale, quantize="every block")
            if m <= 8 and not fits:
                with pytest.raises(ValueError, match="all of K in shared memory"):
                    T.step23_w2a8_fused(x, tiles, scale, quantize="every block")
    wide = torch.randn(2, k + 1, device="cuda", generator=gen).to(torch.bfloat16)
    x = wide[:, 1:]
    assert_matches_w2a8(T.step23_w2a8_fused(x, tiles, scale, out=poisoned(2, n)), x, w, scale)
    assert_matches_w2a8(T.step23_w2a8_fused(x[0], tiles, scale)[None], x[:1], w, scale)
    assert_matches_w2a8(T.step23_w2a8_fused(x, tiles, scale, out=poisoned(2, n), quantize="staged"), x, w, scale)
    for probe in (1, 2, 3):
        T.step23_probe(x[:1], tiles, scale, probe)()
    torch.cuda.synchronize()


def test_steps_24_and_25_compile_to_int8_mma_without_spills():
    import re
    x_tma = [i for i in T.W2A8_TILES_INSTANCES if i.endswith("true>")]
    ptx, report = w2a8_compiled(x_tma)
    assert "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32" in ptx and "fma.rn.bf16x2" not in ptx
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "griddepcontrol.wait" in ptx  # launched early, behind quantize_x
    # the weights and x both come by the engine (x kept in L2 for the other blocks of its slice): no vector
    # loads from global memory at all
    assert not re.findall(r"ld\.global[.\w:]*\.v[24]\.\w+", ptx)
    assert "createpolicy.fractional.L2::evict_last" in ptx and "createpolicy.fractional.L2::evict_first" in ptx
    # step 24: the consumer warps load the block's slice of int8 x themselves, 16 bytes at a time through L2
    loads, loads_report = w2a8_compiled([i for i in T.W2A8_TILES_INSTANCES if i.endswith("false>")])
    assert set(re.findall(r"ld\.global[.\w:]*\.v[24]\.\w+", loads)) == {"ld.global.cg.v4.u32"}
    assert len(report) + len(loads_report) == len(T.W2A8_TILES_INSTANCES) == 32
    for name, r in {**report, **loads_report}.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (name, r)
        assert r["registers"] <= 65536 // (32 * 9), (name, r)  # 8 + 1 warps fit an SM's registers


def test_steps_24_and_25_configs_and_launch():
    with pytest.raises(ValueError, match="warps must be 4 or 8"):
        T.W2A8TilesConfig(warps=2)
    with pytest.raises(ValueError, match=r"\(tiles, stages, chunk\)"):
        T.W2A8TilesConfig(tiles=2, stages=3, chunk=3)
    with pytest.raises(ValueError, match="slices"):
        T.W2A8TilesConfig(slices=0)
    for m, n, k in [(16, 4096, 14336), (1, 4096, 14336), (16, 8192, 28672), (128, 4096, 14336), (9, 77, 513),
                    (1, 1, 1), (33, 20480, 3200), (16, 10, 131072)]:
        cfg = T.w2a8_tiles_config(m, n, k, 132)
        per_slice, grid = T.w2a8_grid(m, n, k, cfg)
        name = f"w2a8_tiles_kernel<{1 if m <= 8 else 2}, {cfg.warps}, {cfg.tiles}, {cfg.stages}, {cfg.chunk}, true>"
        groups = -(-k // 256)
        assert name in T.W2A8_TILES_INSTANCES and T.w2a8_smem_bytes(cfg, min(m, 16), per_slice) <= T.SMEM_LIMIT
        assert grid[0] * cfg.rows >= n and grid[1] * per_slice >= groups > (grid[1] - 1) * per_slice
        assert grid[2] * (8 if m <= 8 else 16) >= m
        if (m, n, k) == (16, 4096, 14336):  # the target case: blocks of 64 rows, K in 2 slices, one wave
            assert (cfg.rows, grid, per_slice) == (64, (64, 2, 1), 28)
    # a config whose x would not fit gets more slices than it asks for
    cfg = T.W2A8TilesConfig(8, 1, 4, 4, 1)
    per_slice, grid = T.w2a8_grid(16, 4096, 14336, cfg)
    assert grid[1] > 1 and T.w2a8_smem_bytes(cfg, 16, per_slice) <= T.SMEM_LIMIT


STEP25_CONFIGS = [T.W2A8TilesConfig(warps, *shape, slices) for warps in (4, 8) for shape in T.W2A8_TILES_SHAPES
                  for slices in (1, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 17, 300), (2, 130, 2000), (5, 300, 5000), (9, 77, 513),
                                     (16, 300, 5000), (17, 40, 777), (33, 129, 4097)])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_gpu_steps_24_and_25_every_config(m, n, k, x_dtype):
    """Steps 24 and 25 compute step 22's product (the same exact int32 sums, the same division): equal to
    float64 within tolerance and to step 22 bit for bit, for every config, poisoned outputs, twice."""
    if not _gpu_is_hopper():
        pytest.skip("steps 24 and 25 need a Hopper GPU (the TMA)")
    w, scale, x, tiles = step22_inputs(m, n, k, x_dtype, seed=m * 1000 + n + k + 11)
    step22 = T.step22_w2a8(x, tiles, scale)
    assert torch.equal(step22, T.step23_w2a8_fused(x, tiles, scale, quantize="separate"))
    for cfg in [None] + STEP25_CONFIGS:
        for step in (T.step24_w2a8_tiles, T.step25_x_tma):
            z = step(x, tiles, scale, out=poisoned(m, n), config=cfg)
            assert_matches_w2a8(z, x, w, scale)
            assert torch.equal(z, step22), f"{step.__name__} at {cfg}: differs from step 22"
            assert torch.equal(step(x, tiles, scale, config=cfg), z), f"{step.__name__} at {cfg}: not deterministic"


@pytest.mark.gpu
def test_gpu_step25_full_size_and_unaligned_x():
    if not _gpu_is_hopper():
        pytest.skip("step 25 needs a Hopper GPU (the TMA)")
    gen = torch.Generator(device="cuda").manual_seed(11)
    for n, k in [(4099, 14335), (8192, 28672)]:
        w, scale = T.quantize_absmean(torch.randn(n, k, device="cuda", generator=gen))
        tiles = T.PackedTernary.pack(w, "2bit_tiles")
        for m in (1, 16, 40):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            z = T.step25_x_tma(x, tiles, scale, out=poisoned(m, n))
            assert_matches_w2a8(z, x, w, scale)
            assert torch.equal(z, T.step22_w2a8(x, tiles, scale))
            assert torch.equal(z, T.step24_w2a8_tiles(x, tiles, scale))
    wide = torch.randn(3, k + 1, device="cuda", generator=gen).to(torch.bfloat16)
    x = wide[:, 1:]  # rows that do not start on 16-byte boundaries
    assert_matches_w2a8(T.step25_x_tma(x, tiles, scale, out=poisoned(3, n)), x, w, scale)
    assert_matches_w2a8(T.step25_x_tma(x[0], tiles, scale)[None], x[:1], w, scale)
    torch.cuda.synchronize()


def test_committed_results_read_under_the_steps_names():
    """Every committed bench JSON holds every step under its series and is read on the GPU clock; the figures,
    tables, targets and headline draw from it."""
    import matplotlib
    matplotlib.use("Agg")
    from studylog import plotting
    for f in plotting.result_files("ternary"):
        gpu = f.parent.name
        results = plotting.load_results("ternary", gpu=gpu)
        # the H100 run predates the steps that split a change out (its notes say so); the H200 run has every step
        lacks = set() if gpu == "nvidia-h200" else {T.SERIES[n] for n in REPORT.SPLIT_STEPS if n != 22}
        assert {s.series for s in T.CHAPTER.steps} - lacks <= set(results.series()), gpu
        assert T.CHAPTER.label(T.SERIES[21]) == "step21_magic_reg"
        assert "every block" in T.CHAPTER.label("step23_every_block")
        view = T.on_gpu_clock(results)
        assert view.rows and all(r["clock"] == "gpu" for r in view.rows)
        figs = figures.figures(results)
        assert {"speedup", "floor", "steps"} <= set(figs)
        rows = T.headline(results)
        assert rows and all(r["kernel"].split()[0].rstrip(",") in {s.name for s in T.CHAPTER.steps} for r in rows)
        assert all(r["clock"] == "gpu" for r in rows)
        assert tables.speedup_table(results, 1).count("\n") > 2
        assert {t["met"] for t in tables.target_checks(results)} <= {True, False, None}
        matplotlib.pyplot.close("all")


def test_step23_timeline_is_a_compile_time_option():
    """The timeline (lab/ternary/w2a8_timeline.py) is the library kernel built with -DW2A8_TIMELINE=1: the
    stamps and the trace argument are there only then."""
    from studylog import cuda
    names = [T.W2A8_QUANTIZE_INSTANCES[0], T.W2A8_INSTANCES[0], T.W2A8_INSTANCES[-1]]
    default = cuda.compile_source("ternary_w2a8", arch="sm_90", name_expressions=names)
    traced = cuda.compile_source("ternary_w2a8", arch="sm_90", name_expressions=names, options=("-DW2A8_TIMELINE=1",))
    assert "globaltimer" not in default.ptx and "globaltimer" in traced.ptx
    for name in names:  # one more parameter (the trace), the same kernels otherwise
        assert traced.lowered_names[name] != default.lowered_names[name]
    if runtime.has_gpu():
        return
    w = ternary(20, 300, torch.Generator().manual_seed(0))
    tiles = T.PackedTernary.pack(w, "2bit_tiles")
    x = torch.randn(1, 300).to(torch.bfloat16)
    with pytest.raises(ValueError, match="trace must have shape"):
        T.step23_timeline(x, tiles, 1.0, torch.zeros(5, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        T.step23_timeline(x, tiles, 1.0, torch.zeros(T.TIMELINE_SLOTS, dtype=torch.int64))


@pytest.mark.gpu
def test_step23_timeline_refuses_a_launch_or_a_trace_it_cannot_use():
    """An LM head's N needs more blocks than the trace has slots for; a trace on the host is not the kernel's."""
    n, k = 128256, 512
    w = torch.randint(-1, 2, (n, k), dtype=torch.int8, device="cuda")
    tiles = T.PackedTernary.pack(w, "2bit_tiles")
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    trace = torch.zeros(T.TIMELINE_SLOTS, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="holds 1875 blocks of 64 slots"):
        T.step23_timeline(x, tiles, 1.0, trace)
    small = T.PackedTernary.pack(w[:4096], "2bit_tiles")
    with pytest.raises(ValueError, match="trace is on cpu"):
        T.step23_timeline(x, small, 1.0, trace.cpu())
    z = T.step23_timeline(x, small, 1.0, trace)()
    torch.cuda.synchronize()
    assert_matches_w2a8(z, x, w[:4096], 1.0)
    assert int((trace != 0).sum()) > 0


def test_lab_scripts_parse_and_the_stream_sweep_compiles():
    """lab/ternary (GPU-only scripts behind steps 21 to 25's numbers, beside the library): the scripts parse,
    use no private name of the package, and the stream sweep's own kernel compiles."""
    import re
    from studylog import cuda, paths
    folder = paths.LAB / "ternary"
    for script in folder.glob("*.py"):
        text = script.read_text()
        compile(text, script.name, "exec")
        assert not re.findall(r"\bT\._\w+|ternary\.\w+\._\w+|cuda\._\w+", text), script.name
    sweep = cuda.compile_source(folder / "stream_read_sweep.cu", arch="sm_90", name_expressions=["stream_ldg<2>"])
    assert "cp.async.bulk" in sweep.ptx and "ld.global.nc.L1::no_allocate.v4" in sweep.ptx


def test_timeline_figure_from_the_lab_results(tmp_path):
    """Notebook 05 plots step 23's timelines from lab/ternary/results: every case gets its four phases, in
    time order, and a mark for its last block; a missing file says where the experiments' README is."""
    import matplotlib
    matplotlib.use("Agg")
    from studylog import plotting
    for name, gpu in (("w2a8_cluster_timeline", "nvidia-h200"), ("w2a8_staged_timeline", "nvidia-h100-80gb-hbm3")):
        timeline = plotting.load_lab("ternary", name, gpu)
        cases = timeline.get("cases", timeline)
        for case in cases.values():
            run = case["runs"][-1]
            medians = [run[key][1] for key in ("start", "x_read", "x_ready", "loop_end", "end")]
            assert medians == sorted(medians) and run["end"][2] >= run["end"][1]
        fig = tables.timeline_figure(timeline)
        ax = fig.axes[0]
        assert len(ax.patches) == 4 * len(cases) and len(ax.get_yticklabels()) == len(cases)
        assert all(p.get_width() >= 0 for p in ax.patches)
        matplotlib.pyplot.close(fig)
    sweep = plotting.load_lab("ternary", "w2a8_cluster_sweep", "nvidia-h200")
    rows = sweep["results"] if isinstance(sweep, dict) else sweep
    assert {r.get("q") for r in rows} >= {"every block", "cluster"}
    assert "Duration" in plotting.load_lab("ternary", "w2a8_tiles_ncu_m16.txt", "nvidia-h200")
    with pytest.raises(FileNotFoundError, match="lab/ternary/README.md"):
        plotting.load_lab("ternary", "no_such_experiment", root=tmp_path)
