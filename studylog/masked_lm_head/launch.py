"""Launching Triton kernels with little host time, what steps 12 and 13 teach (steps 0-11 use ``kernel[grid]``):
:class:`FastKernel` reduces the arguments to what ``kernel[grid]`` specialises on, in one pass, and calls the kept
compiled kernel's launcher. It needs the constexprs after the runtime parameters and no launch hook (else, and in
the interpreter: ``kernel[grid]``)."""

from __future__ import annotations

from typing import Any

import torch
from studylog import runtime

_I32 = 2**31
_GPU = runtime.mode() == "gpu"  # else Triton's interpreter runs every call
try:
    from triton import knobs as _triton_knobs

    _HOOKS = _triton_knobs.runtime
except ImportError:  # older Triton: no launch hooks to respect
    _HOOKS = None


def _installed(hook) -> bool:
    """Whether a launch hook is installed: a callable, or a chain of hooks (Triton 3.4+) holding one."""
    calls = getattr(hook, "calls", None)
    return hook is not None and (calls is None or bool(calls))


def specialization(args: tuple, skip: frozenset[int] = frozenset()) -> tuple[tuple, list]:
    """(key, values): what Triton specialises a launch on (a pointer's 16-byte alignment and dtype; an int
    whether it is 1, divisible by 16, and fits in 32 bits; ``skip``: only the width), and the launcher's values."""
    values = [a if type(a) is int else a.data_ptr() for a in args]
    flags = [(v == 1) + 2 * (v % 16 == 0) + 4 * (not -_I32 <= v < _I32) if type(a) is int else 8 + 2 * (v % 16 == 0)
             for a, v in zip(args, values)]
    if skip:
        flags = [f & 4 if i in skip else f for i, f in enumerate(flags)]
    return (tuple(flags), tuple([a.dtype for a in args if type(a) is not int])), values


class FastKernel:
    """``FastKernel(kernel)(grid, args, constexprs)``: a 1-D launch, ``args`` in the kernel's order (the first a
    tensor on the launch's device). Callers keep one ``constexprs`` dict per configuration: calls with the same
    pointers, ints and dict skip the specialisation work."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled: dict[tuple, Any] = {}
        self._memo: dict[tuple, Any] = {}
        params = getattr(kernel, "params", [])  # the interpreter's kernel object has none
        runtime_params = [p for p in params if not p.is_constexpr]
        self._skip = frozenset(i for i, p in enumerate(runtime_params) if p.do_not_specialize)
        self._n_runtime, self._n_constexpr = len(runtime_params), len(params) - len(runtime_params)
        # the fast path: on the GPU, with every constexpr after the runtime parameters
        self._fast = _GPU and bool(params) and all(p.is_constexpr for p in params[self._n_runtime:])

    def __call__(self, grid: int, args: tuple, constexprs: dict[str, Any]) -> None:
        if not self._fast or (_HOOKS is not None and (_installed(_HOOKS.launch_enter_hook)
                                                      or _installed(_HOOKS.launch_exit_hook))):
            self.kernel[(grid,)](*args, **constexprs)
            return
        values = [a if type(a) is int else a.data_ptr() for a in args]
        device = args[0].get_device()
        # the same pointers and ints with the same constexpr dict specialise the same way: a hit skips that work
        memo_key = (id(constexprs), device, *values)
        hit = self._memo.get(memo_key)
        if hit is not None and hit[0] is constexprs:
            entry = hit[1]
        else:
            spec, _ = specialization(args, self._skip)
            key = (device, spec, tuple(constexprs.items()))
            entry = self._compiled.get(key)
            if entry is None:
                self._compile(key, grid, args, constexprs)
                return
            if len(self._memo) > 512:  # new pointers every call (outputs allocated per call): keep it small
                self._memo.clear()
            self._memo[memo_key] = (constexprs, entry)
        compiled, const_values = entry
        compiled.run(grid, 1, 1, torch._C._cuda_getCurrentRawStream(device), compiled.function,
                     compiled.packed_metadata, None, None, None, *values, *const_values)

    def _compile(self, key: tuple, grid: int, args: tuple, constexprs: dict[str, Any]) -> None:
        """Launch through ``kernel[grid]`` (which compiles or finds the kernel) and keep what it ran."""
        compiled = self.kernel[(grid,)](*args, **constexprs)
        names = [p.name for p in self.kernel.params if p.is_constexpr]
        if compiled is not None and hasattr(compiled, "run") and len(args) == self._n_runtime:
            const_values = tuple(constexprs[n] for n in names if n in constexprs)
            if len(const_values) == self._n_constexpr:
                self._compiled[key] = (compiled, const_values)

    def cached(self) -> int:  # how many specialisations have a kept compiled kernel
        return len(self._compiled)

