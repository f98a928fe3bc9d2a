"""Compile CUDA C++ kernels with NVRTC and launch them on torch tensors.

:func:`compile_source` needs no driver, so the tests compile every ``.cu`` without a GPU; :func:`load` compiles for the
visible GPU and returns a :class:`CudaModule` whose kernels launch on torch's current stream. Compiles are kept on disk.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import functools
import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from studylog.paths import csrc_folders

#: The architecture to compile for when no GPU is visible (Hopper: H100/H200).
DEFAULT_ARCH = "sm_90"


#: Template instances each source is launched with (file stem -> C++ name expressions), so that the tests compile
#: every ``.cu`` file with them (a source made only of templates compiles to no kernel).
INSTANCES: dict[str, tuple[str, ...]] = {}


def declare_instances(source: str, name_expressions: Sequence[str]) -> None:
    """Record the template instances a chapter launches from ``source`` (a file stem in ``csrc``)."""
    key = source.removesuffix(".cu")  # the same entry whether the file is named with its suffix or not
    INSTANCES[key] = tuple(dict.fromkeys(INSTANCES.get(key, ()) + tuple(name_expressions)))


def source_path(name: str) -> Path:
    """Path of a kernel source in the package's ``csrc`` folders (``name`` with or without ``.cu``)."""
    file = name if name.endswith((".cu", ".cuh", ".c")) else f"{name}.cu"
    for folder in csrc_folders():
        if (folder / file).is_file():
            return folder / file
    raise FileNotFoundError(f"no CUDA source {name!r} in {[str(f) for f in csrc_folders()]}")


def read_source(name: str) -> str:
    return source_path(name).read_text()


def _resolve(source: str | Path) -> tuple[str, str]:
    """(text, file name) of a source given as a path, a name in ``csrc`` or the text itself."""
    if isinstance(source, Path):
        return source.read_text(), source.name
    if "\n" in source or "__global__" in source:
        return source, "kernel.cu"
    path = source_path(source)
    return path.read_text(), path.name


class CudaCompileError(RuntimeError):
    """NVRTC rejected a source; the message carries its log."""


@dataclass
class CompiledSource:
    """What NVRTC produced for one source and one target."""

    name: str
    arch: str
    ptx: str
    cubin: bytes | None
    log: str
    lowered_names: dict[str, str] = field(default_factory=dict)

    def ptxas_report(self) -> dict[str, dict[str, int]]:
        """Per (mangled) kernel name: ``registers``, ``stack_bytes``, ``spill_stores``, ``spill_loads`` (ptxas -v)."""
        report: dict[str, dict[str, int]] = {}
        current = None
        for line in self.log.splitlines():
            if m := re.search(r"Function properties for (\S+)|Compiling entry function '(\S+)'", line):
                current = report.setdefault(m.group(1) or m.group(2), {})
            elif current is not None:
                if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
                    current.update(stack_bytes=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
                if m := re.search(r"Used (\d+) registers", line):
                    current["registers"] = int(m[1])
        return report

    def ptx_function(self, kernel: str) -> str:
        """The PTX of one entry function (``kernel`` may be a source-level or lowered name)."""
        mangled = self.lowered_names.get(kernel, kernel)
        if not (m := re.search(r"\.entry\s+" + re.escape(mangled) + r"\b", self.ptx)):
            raise KeyError(f"no entry {kernel!r} in the PTX of {self.name}")
        # the body runs to the next top-level declaration: a "}" at the start of a line may close an inline asm block
        top_level = re.compile(r"^(?:\s*// \.(?:globl|weak)\b|\.visible|\.weak|\.entry|\.func|\.extern)", re.MULTILINE)
        nxt = top_level.search(self.ptx, m.end())
        return self.ptx[m.start() : nxt.start() if nxt else len(self.ptx)].rstrip() + "\n"


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - dependency missing
        raise ImportError("compiling CUDA C++ needs NVRTC through the 'cuda-bindings' package "
                          "(pip install cuda-bindings nvidia-cuda-nvrtc)") from exc
    return nvrtc


def _check_nvrtc(result, what: str):
    nvrtc = _nvrtc()
    err, *rest = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CudaCompileError(f"NVRTC {what} failed: {err!r}")
    return rest[0] if len(rest) == 1 else rest


def _include_dirs() -> list[str]:
    """Folders of the package's headers (every ``csrc``) and of the CUDA runtime's (``cuda_fp16.h``...)."""
    dirs = [str(folder) for folder in csrc_folders()]
    with contextlib.suppress(Exception):
        import nvidia.cuda_runtime as rt  # pip's nvidia-cuda-runtime

        dirs.append(str(Path(rt.__path__[0]) / "include"))
    if Path("/usr/local/cuda/include").is_dir():
        dirs.append("/usr/local/cuda/include")
    return dirs


def compile_source(source: str | Path, *, arch: str = DEFAULT_ARCH, options: Sequence[str] = (),
                   name_expressions: Sequence[str] = (), name: str | None = None) -> CompiledSource:
    """Compile CUDA C++ (text, or a path or name of a file in a ``csrc`` folder) for ``sm_XX`` (PTX, cubin and ptxas
    report) or ``compute_XX`` (PTX only); ``name_expressions`` (``"kernel<float, 3>"``) go to ``lowered_names``."""
    text, default_name = _resolve(source)
    name = name or default_name
    if not re.fullmatch(r"(sm|compute)_\d+a?", arch):
        raise ValueError(f"arch must look like 'sm_90' or 'compute_90', got {arch!r}")
    cache = _cache_file(text, name, arch, options, name_expressions)
    if cache is not None and cache.is_file():
        with contextlib.suppress(Exception):  # a damaged entry: compile again (and replace it)
            entry = json.loads(cache.read_text())
            entry["cubin"] = None if entry["cubin"] is None else base64.b64decode(entry["cubin"])
            return CompiledSource(**entry)
    compiled = _compile(text, name, arch, options, name_expressions)
    if cache is not None:
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            partial = cache.with_suffix(f".{os.getpid()}.tmp")
            entry = dict(compiled.__dict__)
            entry["cubin"] = None if compiled.cubin is None else base64.b64encode(compiled.cubin).decode()
            partial.write_text(json.dumps(entry))
            os.replace(partial, cache)  # whole or not at all: test workers share the folder
    return compiled


def compile_cache_dir() -> Path | None:
    """Where compiles are kept: ``$STUDYLOG_NVRTC_CACHE`` (``off``: nowhere), else ``~/.cache/studylog/nvrtc``."""
    folder = os.environ.get("STUDYLOG_NVRTC_CACHE", str(Path.home() / ".cache" / "studylog" / "nvrtc"))
    return None if folder == "off" else Path(folder)


def _cache_file(text: str, name: str, arch: str, options: Sequence[str], name_expressions: Sequence[str]):
    """The cache entry of one compile, keyed by all NVRTC sees (source, every ``.cuh``, options, its version)."""
    if (folder := compile_cache_dir()) is None:
        return None
    digest = hashlib.sha256()
    version = _check_nvrtc(_nvrtc().nvrtcVersion(), "version")
    headers = sorted((p for folder in csrc_folders() for p in folder.glob("*.cuh")), key=lambda p: p.name)
    for part in (text, name, arch, repr(tuple(options)), repr(tuple(name_expressions)), repr(_include_dirs()),
                 repr(version), *(h.read_text() for h in headers)):
        digest.update(part.encode() + b"\0")
    return folder / f"{digest.hexdigest()}.json"


def _compile(text: str, name: str, arch: str, options: Sequence[str],
             name_expressions: Sequence[str]) -> CompiledSource:
    nvrtc = _nvrtc()
    prog = _check_nvrtc(nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], []), "create")
    try:
        for expr in name_expressions:
            _check_nvrtc(nvrtc.nvrtcAddNameExpression(prog, expr.encode()), "add name expression")
        opts = [f"--gpu-architecture={arch}", "--std=c++17", "-default-device"]
        if arch.startswith("sm_"):
            opts.append("--ptxas-options=-v")
        opts += [f"--include-path={d}" for d in _include_dirs()]
        opts += list(options)
        encoded = [o.encode() for o in opts]
        (compile_err,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)

        def output(get_size, get, what: str) -> bytes:
            # NVRTC writes into the buffer it is given: a mutable one of our own, never a shared bytes object
            buffer = bytearray(_check_nvrtc(get_size(prog), f"{what} size"))
            _check_nvrtc((get(prog, buffer)[0], None), what)
            return bytes(buffer)

        log_text = output(nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog, "log").decode(
            errors="replace").rstrip("\x00").strip()
        if compile_err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CudaCompileError(f"NVRTC could not compile {name} for {arch}:\n{log_text}")
        ptx = output(nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, "PTX").decode().rstrip("\x00")
        cubin = output(nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, "cubin") if arch.startswith("sm_") else None
        lowered = {expr: _check_nvrtc(nvrtc.nvrtcGetLoweredName(prog, expr.encode()), "lowered name").decode()
                   for expr in name_expressions}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompiledSource(name, arch, ptx, cubin, log_text, lowered)


# Loading and launching on the GPU

#: Argument kinds a kernel signature may use, with the ``struct`` format each is packed as (8 bytes a slot).
ARG_TYPES = {"ptr": "Q", "i32": "i4x", "u32": "I4x", "i64": "q", "u64": "Q", "f32": "f4x", "f64": "d"}


def _driver():
    from cuda.bindings import driver  # imported on first use: compiling needs no driver

    return driver


def _check_cu(result, what: str):
    driver = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise RuntimeError(f"CUDA driver call {what} failed: {err!r} ({msg.decode() if msg else ''})")
    return rest[0] if len(rest) == 1 else rest


@functools.lru_cache(maxsize=None)
def _ensure_context(device_index: int) -> None:
    """Make torch's primary context current, so modules load into the context torch uses."""
    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.empty(1, device=f"cuda:{device_index}")  # forces torch to create its context
    _check_cu(_driver().cuInit(0), "cuInit")


class CudaKernel:
    """One ``__global__`` function, launched on torch's current stream. The argument block is built once and a launch
    only packs values into it: a launch's host cost matters for kernels of a few microseconds."""

    def __init__(self, module: "CudaModule", name: str, function, signature: Sequence[str]):
        if unknown := [s for s in signature if s not in ARG_TYPES]:
            raise ValueError(f"unknown argument kinds {unknown}; use {sorted(ARG_TYPES)}")
        self.module, self.name, self.function, self.signature = module, name, function, tuple(signature)
        self._pointer_slots = [i for i, kind in enumerate(self.signature) if kind == "ptr"]
        self._struct = struct.Struct("<" + "".join(ARG_TYPES[k] for k in self.signature))
        self._block, self._params = _argument_block(bytes(self._struct.size), len(self.signature))
        self._params_address = ctypes.addressof(self._params)
        self._streams: dict[int, object] = {}
        self._launch_configs: dict[tuple, object] = {}

    def __call__(self, grid, block, *args, shared_mem: int = 0, early: bool = False):
        """Launch on ``grid`` x ``block``. ``early``: a programmatic dependent launch (the kernel must run
        ``griddepcontrol.wait`` before reading what the previous one writes)."""
        grid, block = self._dims(grid, block, args)
        ctypes.memmove(self._block, *self._pack(args))
        self._launch(grid, block, shared_mem, self._params_address, early)

    def _launch(self, grid: tuple, block: tuple, shared_mem: int, params_address: int, early: bool) -> None:
        """Launch with the argument block at ``params_address`` on torch's current stream."""
        driver = _driver()
        # the stream's raw handle: the private call Triton uses, microseconds cheaper per launch
        handle = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
        if (cu_stream := self._streams.get(handle)) is None:
            cu_stream = self._streams[handle] = driver.CUstream(handle)
        if early:
            err = driver.cuLaunchKernelEx(self._launch_config(grid, block, shared_mem, cu_stream), self.function,
                                          params_address, 0)
        else:
            err = driver.cuLaunchKernel(self.function, *grid, *block, shared_mem, cu_stream, params_address, 0)
        if err[0] != driver.CUresult.CUDA_SUCCESS:
            _check_cu(err, f"cuLaunchKernel({self.name}, grid={grid}, block={block})")

    def _dims(self, grid, block, args) -> tuple[tuple, tuple]:
        """The launch's grid and block as 3-tuples, checked with the arguments' count."""
        if len(args) != len(self.signature):
            raise TypeError(f"{self.name} takes {len(self.signature)} arguments ({self.signature}), got {len(args)}")
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        if min(grid) < 1 or min(block) < 1:
            raise ValueError(f"{self.name}: grid {grid} and block {block} must be positive")
        return grid, block

    def _pack(self, args) -> tuple[bytes, int]:
        """The argument block's bytes for ``args`` (tensors by their addresses) and their length."""
        values = list(args)
        for i in self._pointer_slots:
            arg = values[i]
            if isinstance(arg, torch.Tensor):
                if not arg.is_cuda:
                    raise ValueError(f"{self.name}: argument {i} is a tensor on {arg.device}, not on the GPU")
                values[i] = arg.data_ptr()
            elif arg is None:
                values[i] = 0
            elif not isinstance(arg, int):
                raise TypeError(f"{self.name}: argument {i} must be a CUDA tensor or an address")
        try:
            packed = self._struct.pack(*values)
        except struct.error as exc:
            raise TypeError(f"{self.name}: arguments {args!r} do not fit {self.signature}: {exc}") from None
        return packed, len(packed)

    def bind(self, grid, block, *args, shared_mem: int = 0, early: bool = False) -> "BoundLaunch":
        """This launch with its arguments checked and packed once, for a loop that launches it again and again; the
        tensors given must outlive the result."""
        grid, block = self._dims(grid, block, args)
        return BoundLaunch(self, grid, block, self._pack(args)[0], shared_mem, early)

    def _launch_config(self, grid, block, shared_mem: int, cu_stream):
        """An early launch's configuration, built once per shape and stream (costlier than a launch)."""
        key = (grid, block, shared_mem, int(cu_stream))
        if key not in self._launch_configs:
            driver = _driver()
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            config = driver.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = grid
            config.blockDimX, config.blockDimY, config.blockDimZ = block
            config.sharedMemBytes, config.hStream = shared_mem, cu_stream
            config.attrs, config.numAttrs = [attr], 1
            self._launch_configs[key] = config
        return self._launch_configs[key]

    def set_max_dynamic_shared_memory(self, nbytes: int) -> None:
        """Allow more than 48 KiB of dynamic shared memory for this kernel."""
        driver = _driver()
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check_cu(driver.cuFuncSetAttribute(self.function, attr, nbytes), "cuFuncSetAttribute")


class BoundLaunch:
    """A kernel's launch with its arguments packed (:meth:`CudaKernel.bind`); a call launches it."""

    def __init__(self, kernel: CudaKernel, grid: tuple, block: tuple, packed: bytes, shared_mem: int, early: bool):
        self.kernel, self.grid, self.block, self.shared_mem, self.early = kernel, grid, block, shared_mem, early
        self._block, self._params = _argument_block(packed, len(kernel.signature))
        base = ctypes.addressof(self._block)
        self._pointers = {i: ctypes.c_uint64.from_address(base + 8 * i) for i in kernel._pointer_slots}
        self._params_address = ctypes.addressof(self._params)

    def set_pointer(self, i: int, tensor: torch.Tensor) -> None:
        """Argument ``i`` (a pointer) becomes ``tensor``'s address; the caller has checked its device and shape."""
        self._pointers[i].value = tensor.data_ptr()

    def __call__(self) -> None:
        self.kernel._launch(self.grid, self.block, self.shared_mem, self._params_address, self.early)


def _argument_block(packed: bytes, n: int):
    """An argument block holding ``packed`` (8 bytes an argument), and the array of its ``n`` addresses."""
    block = ctypes.create_string_buffer(packed, max(len(packed), 8))
    base = ctypes.addressof(block)
    return block, (ctypes.c_void_p * max(n, 1))(*[base + 8 * i for i in range(n)])


class CudaModule:
    """A compiled source loaded into torch's CUDA context."""

    def __init__(self, compiled: CompiledSource):
        self.compiled = compiled
        self.handle = _check_cu(_driver().cuModuleLoadData(compiled.cubin), f"cuModuleLoadData({compiled.name})")

    def kernel(self, name: str, signature: Sequence[str]) -> CudaKernel:
        """The kernel ``name`` (an ``extern "C"`` name or a name expression given to :func:`load`)."""
        lowered = self.compiled.lowered_names.get(name, name)
        function = _check_cu(_driver().cuModuleGetFunction(self.handle, lowered.encode()),
                             f"cuModuleGetFunction({name})")
        return CudaKernel(self, name, function, signature)


_MODULES: dict[tuple, CudaModule] = {}


def load(source: str | Path, *, options: Sequence[str] = (), name_expressions: Sequence[str] = (),
         device: torch.device | int | None = None) -> CudaModule:
    """Compile ``source`` for the current GPU and load it (cached per source text and options)."""
    if not torch.cuda.is_available():
        raise RuntimeError("launching a CUDA C++ kernel needs a CUDA GPU, and torch sees none; "
                           "use studylog.cuda.compile_source to look at PTX instead")
    index = torch.cuda.current_device() if device is None else torch.device("cuda", device).index or 0
    _ensure_context(index)
    text, name = _resolve(source)
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability(index))
    key = (hashlib.sha256(text.encode()).hexdigest(), arch, tuple(options), tuple(name_expressions), index)
    if key not in _MODULES:
        with torch.cuda.device(index):
            compiled = compile_source(text, arch=arch, options=options, name_expressions=name_expressions, name=name)
            _MODULES[key] = CudaModule(compiled)
    return _MODULES[key]
