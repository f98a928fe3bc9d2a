"""Chapter 4's latency floor (studylog.ctc.floor): the chain kernel compiles, its PTX and SASS hold one frame's
update and exchange and nothing else, its arguments are checked, its float64 model is right by hand. GPU: the
kernel against that model, and under CUDA-graph capture."""

from __future__ import annotations

import math

import pytest
import torch

from book.ctc import compiled as book_compiled
from studylog import cuda
from studylog.ctc import floor

ARCHS = ("sm_80", cuda.DEFAULT_ARCH)  # sm_90: what every CTC kernel is compiled for in the tests


def chain_constant(s: int) -> float:
    """What the kernel adds at state ``s`` every frame (base-2 log units; exact in float32)."""
    return -1.25 - 0.0625 * (s & 7)


@pytest.fixture(scope="module")
def compiled():
    return cuda.compile_source(floor.SOURCE, arch=cuda.DEFAULT_ARCH)


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_spills(arch):
    report = cuda.compile_source(floor.SOURCE, arch=arch).ptxas_report()
    assert set(report) == {floor.KERNEL}, report
    assert report[floor.KERNEL]["spill_stores"] == report[floor.KERNEL]["spill_loads"] == 0


def test_ptx_is_one_frame_update_and_exchange(compiled):
    """Per frame in the code (one shuffle each): a blank's and a label's log-sum-exp twice (6 ex2, 4 lg2), no global
    load anywhere, the barrier only in the several-warps path (one a frame and one before its loop), a loop."""
    ptx = compiled.ptx_function(floor.KERNEL)
    frames = ptx.count("shfl.sync.up")
    assert frames >= 2  # a loop (unrolled) in each of the two paths
    assert ptx.count("ex2.approx.ftz.f32") == 6 * frames and ptx.count("lg2.approx.ftz.f32") == 4 * frames
    assert ptx.count("bar.sync") == frames // 2 + 1
    assert book_compiled.global_loads(ptx) == {"ld.global": 0, "ld.global.nc": 0}
    assert ptx.count("st.global") == 2 * floor.CHAIN_GRAIN  # the final values, once per path
    assert "$L__BB" in ptx and ".pragma \"nounroll\"" in ptx  # the frame loop (4 frames a trip) and its remainder


def test_sass_is_branch_free_with_mufu_per_frame(compiled):
    if book_compiled.nvdisasm_path() is None:
        pytest.skip("nvdisasm is not available (neither on the PATH nor in Triton's wheel)")
    (row,) = book_compiled.sass_counts(compiled, [floor.KERNEL])
    assert row["BSSY"] == 0 and row["REDUX"] == 0
    assert row["MUFU"] == 10 * row["SHFL"]  # ex2 and lg2 on the MUFU unit: 10 a frame, one shuffle a frame


@pytest.mark.parametrize("states, threads", [(1, 32), (127, 32), (128, 32), (129, 64), (511, 128),
                                             (floor.MAX_CHAIN_STATES, 1024)])
def test_threads(states, threads):
    assert floor.chain_threads(states) == threads


@pytest.mark.parametrize("kwargs, error, match", [
    ({"frames": 0}, ValueError, "frames"),
    ({"frames": -3}, ValueError, "frames"),
    ({"frames": 1.5}, TypeError, "frames"),
    ({"states": 0}, ValueError, "states"),
    ({"states": floor.MAX_CHAIN_STATES + 1}, ValueError, "states"),
    ({"states": True}, TypeError, "states"),
    ({"device": "cpu"}, ValueError, "device"),
    ({"out": torch.empty(127)}, ValueError, "out"),
    ({"out": torch.empty(127, dtype=torch.float64, device="meta")}, TypeError, "out"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    args = {"frames": 300, "states": 127} | kwargs
    frames, states = args.pop("frames"), args.pop("states")
    with pytest.raises(error, match=match):
        floor.chain_floor(frames, states, **args)


def chain_reference(frames: int, states: int) -> list[float]:
    """The kernel's recursion in float64 (Python floats) from all zeros: after each frame, state s holds
    log2(2^r[s] + 2^r[s-1] (+ 2^r[s-2] at a label, odd s >= 3)) + chain_constant(s) of the previous frame's r."""
    r = [0.0] * states
    consts = [chain_constant(s) for s in range(states)]
    for _ in range(frames):
        new = []
        for s in range(states):
            terms = [r[s]] + ([r[s - 1]] if s >= 1 else []) + ([r[s - 2]] if s % 2 == 1 and s >= 2 else [])
            m = max(terms)
            new.append(m + math.log2(sum(2.0 ** (x - m) for x in terms)) + consts[s])
        r = new
    return r


def test_reference_by_hand():
    # one frame from zeros: s = 0 keeps one term, s = 1 and 2 add two equal terms (log2 2 = 1)
    assert chain_reference(1, 3) == [-1.25, 1 - 1.3125, 1 - 1.375]
    # s = 3, a label, takes three equal terms at the first frame
    assert chain_reference(1, 4)[3] == pytest.approx(math.log2(3) - 1.4375, abs=1e-15)
    # the constants are exact in float32 (multiples of 1/16), so the kernel adds the same numbers
    consts = [chain_constant(s) for s in range(16)]
    assert torch.tensor(consts, dtype=torch.float32).double().tolist() == consts


# -- GPU ---------------------------------------------------------------------------------------------

#: Float32 with ex2/lg2.approx against float64: values reach a few hundred after 300 frames (an ulp is 3e-5 there).
ATOL, RTOL = 2e-3, 2e-5


@pytest.mark.gpu
@pytest.mark.parametrize("frames, states", [(300, 127), (150, 127), (1, 1), (7, 2), (40, 300), (3, 4096)])
def test_matches_the_float64_recursion_on_gpu(frames, states):
    got = floor.chain_floor(frames, states)
    assert got.shape == (states,) and got.dtype == torch.float32
    got = got.cpu().double()
    assert torch.isfinite(got).all()
    want = torch.tensor(chain_reference(frames, states), dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.gpu
def test_graph_capture_on_gpu():
    out = torch.full((127,), float("nan"), device="cuda")
    eager = floor.chain_floor(300, 127)
    floor.chain_floor(300, 127, out=out)  # compiled and loaded before the capture
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert floor.chain_floor(300, 127, out=out) is out
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
