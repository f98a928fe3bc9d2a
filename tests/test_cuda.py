import importlib

import pytest
import torch

from studylog import chapter, cuda
from studylog.paths import csrc_folders

# chapter packages declare the template instances of their sources when imported
for _module in chapter.CHAPTERS.values():
    importlib.import_module(_module)
#: Every ``.cu`` file shipped in the package (the shared ``csrc`` and each chapter's), sorted by name.
CU_SOURCES = sorted((p for folder in csrc_folders() for p in folder.glob("*.cu")), key=lambda p: p.name)


def test_package_ships_cuda_sources():
    assert CU_SOURCES, "no .cu files found under studylog/csrc"


@pytest.mark.parametrize("path", CU_SOURCES, ids=lambda p: p.name)
def test_every_cu_compiles_for_hopper(path):
    """Every kernel source compiles with NVRTC (no GPU needed) to PTX and an sm_90 cubin."""
    compiled = cuda.compile_source(path, arch="sm_90", name_expressions=cuda.INSTANCES.get(path.stem, ()))
    assert ".entry" in compiled.ptx, f"{path.name} has no kernel: declare its template instances"
    assert compiled.cubin and len(compiled.cubin) > 0
    report = compiled.ptxas_report()
    assert report and all("registers" in r for r in report.values()), compiled.log


def test_restrict_and_ldg_become_non_coherent_loads():
    compiled = cuda.compile_source("tour_axpy", arch="sm_90")
    plain = compiled.ptx_function("axpy_plain")
    ldg = compiled.ptx_function("axpy_restrict_ldg")
    assert "ld.global.nc" not in plain
    assert "ld.global.nc" in ldg


KERNEL = 'extern "C" __global__ void k(int *p) { p[threadIdx.x] = %d; }\n'


def test_compiles_are_kept_between_processes_and_keyed_by_what_nvrtc_sees(tmp_path, monkeypatch):
    """The compile cache: a second compile of the same source, options and headers reads the first's
    entry (NVRTC is not called); a different source, option or header compiles anew; damaged entries
    are compiled again; "off" keeps nothing."""
    monkeypatch.setenv("STUDYLOG_NVRTC_CACHE", str(tmp_path / "cache"))
    first = cuda.compile_source(KERNEL % 1, arch="sm_90")
    assert len(list((tmp_path / "cache").iterdir())) == 1
    calls = []
    real = cuda._compile
    monkeypatch.setattr(cuda, "_compile", lambda *a: calls.append(a) or real(*a))
    assert cuda.compile_source(KERNEL % 1, arch="sm_90") == first and not calls  # from the cache, equal
    cuda.compile_source(KERNEL % 2, arch="sm_90")
    cuda.compile_source(KERNEL % 1, arch="sm_90", options=["-DX=1"])
    cuda.compile_source(KERNEL % 1, arch="compute_90")
    assert len(calls) == 3
    headers, folders = tmp_path / "csrc", cuda.csrc_folders
    headers.mkdir()
    (headers / "h.cuh").write_text("#pragma once\n")
    monkeypatch.setattr(cuda, "csrc_folders", lambda: [headers])
    before = cuda._cache_file(KERNEL % 1, "kernel.cu", "sm_90", (), ())
    (headers / "h.cuh").write_text("#pragma once\n#define EDITED 1\n")
    assert cuda._cache_file(KERNEL % 1, "kernel.cu", "sm_90", (), ()) != before
    monkeypatch.setattr(cuda, "csrc_folders", folders)  # the package's headers again
    entry = cuda._cache_file(KERNEL % 1, "kernel.cu", "sm_90", (), ())
    entry.write_text("{not json")
    again = cuda.compile_source(KERNEL % 1, arch="sm_90")  # compiled anew (ptxas' log holds its own time)
    assert (again.ptx, again.cubin) == (first.ptx, first.cubin) and len(calls) == 4
    monkeypatch.setenv("STUDYLOG_NVRTC_CACHE", "off")
    assert cuda.compile_cache_dir() is None and cuda._cache_file(KERNEL % 1, "kernel.cu", "sm_90", (), ()) is None


def test_compiling_leaves_python_s_shared_bytes_alone(tmp_path, monkeypatch):
    """NVRTC writes its log into the buffer it is given: a PTX-only compile has an empty log (1 byte), and a
    buffer made as b" " * 1 is Python's one shared b" ", which NVRTC overwrote with a NUL for the whole
    process (outlines-core then lost its space token, in whichever test ran next)."""
    monkeypatch.setenv("STUDYLOG_NVRTC_CACHE", "off")
    for arch in ("compute_90", "sm_90"):
        cuda.compile_source(KERNEL % 3, arch=arch)
    assert bytes([32])[0] == 32 and " ".encode()[0] == 32  # (Python's one-byte b" " reads as a space still)


def test_compile_error_carries_the_log():
    with pytest.raises(cuda.CudaCompileError, match="undefined"):
        cuda.compile_source('extern "C" __global__ void k() { undefined_thing(); }\n')


def test_name_expressions_give_lowered_names():
    src = "template <int N> __global__ void fill(int* out) { out[threadIdx.x] = N; }\n"
    compiled = cuda.compile_source(src, name_expressions=["fill<3>", "fill<5>"])
    assert set(compiled.lowered_names) == {"fill<3>", "fill<5>"}
    assert all(name.startswith("_Z") for name in compiled.lowered_names.values())


def test_bad_arch_is_rejected():
    with pytest.raises(ValueError, match="arch"):
        cuda.compile_source("tour_axpy", arch="hopper")


def test_missing_source_is_named():
    with pytest.raises(FileNotFoundError, match="no_such_kernel"):
        cuda.compile_source("no_such_kernel")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_load_without_gpu_says_why():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        cuda.load("tour_axpy")


@pytest.mark.gpu
def test_launch_on_torch_tensors():
    module = cuda.load("tour_axpy")
    for name in ("axpy_plain", "axpy_restrict_ldg"):
        kernel = module.kernel(name, ["ptr", "ptr", "f32", "i32"])
        n = 1_000_003
        x = torch.randn(n, device="cuda")
        y = torch.randn(n, device="cuda")
        ref = 2.5 * x.double() + y.double()
        kernel(((n + 255) // 256,), (256,), x, y, 2.5, n)
        torch.cuda.synchronize()
        torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_launch_runs_on_torch_current_stream():
    module = cuda.load("tour_axpy")
    kernel = module.kernel("axpy_plain", ["ptr", "ptr", "f32", "i32"])
    stream = torch.cuda.Stream()
    n = 1 << 20
    x = torch.ones(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        kernel((n // 256,), (256,), x, y, 3.0, n)
        z = y * 2  # same stream: must see the kernel's result
    stream.synchronize()
    assert torch.all(z == 6.0)


@pytest.mark.gpu
def test_launch_checks_arguments():
    kernel = cuda.load("tour_axpy").kernel("axpy_plain", ["ptr", "ptr", "f32", "i32"])
    x = torch.zeros(4, device="cuda")
    with pytest.raises(ValueError, match="not on the GPU"):
        kernel((1,), (32,), torch.zeros(4), x, 1.0, 4)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        kernel((1,), (32,), x, x, 1.0)
    with pytest.raises(RuntimeError, match="cuLaunchKernel"):
        kernel((1,), (4096,), x, x, 1.0, 4)  # more threads per block than the GPU allows
