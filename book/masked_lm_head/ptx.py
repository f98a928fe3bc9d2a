"""What the compiler makes of a step's loads (the lesson's PTX tables): its kernel compiled for sm_90 offline (no
GPU needed), and the load instructions of the PTX counted.

The compile runs in a fresh Python process: Triton builds its own library functions (``tl.cdiv``...) for
the interpreter when it is imported in interpreter mode, and those cannot be compiled afterwards in the
same process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Sequence

import triton
import triton.language as tl

from studylog.masked_lm_head.compact import compact_rows_kernel, one_wait_kernel, one_wait_rows
from studylog.masked_lm_head.dense import block_skip_kernel, dense_matmul_kernel, row_skip_kernel
from studylog.masked_lm_head.formats import HIDDEN, LAYOUTS, default_tiles, need_layout


def _offline(code: str, *args: str):
    """Run ``code`` in a fresh Python process without the interpreter; its last line of output, as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"offline compile failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _compilable(kernel):
    """``kernel`` as a JIT function Triton compiles for a GPU target. This process imported the package in
    interpreter mode, so the ``@triton.jit`` helpers the kernel calls (globals of its module) are interpreter
    wrappers too: they are made JIT functions again, in this process only (it runs no kernel)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    raw = getattr(kernel, "fn", kernel)
    for name, value in list(raw.__globals__.items()):
        if isinstance(value, InterpretedFunction):
            raw.__globals__[name] = JITFunction(value.fn)
    return JITFunction(raw)


def ptx_loads(cases: Sequence[tuple[int, str, int]]) -> dict[tuple[int, str, int], dict[str, int]]:
    """For each ``(step, layout, batch)`` (steps 0-3), compile the step's kernel for sm_90 with the
    bench's tile sizes and count the global-memory loads in its PTX by width: ``"cp.async 16 B"``
    are asynchronous 16-byte copies into shared memory (what a streaming matmul wants), ``"ld 2 B"``
    single bf16 loads. No GPU is needed."""
    for step, layout, batch in cases:
        if step not in (0, 1, 2, 3) or layout not in LAYOUTS or batch < 1:
            raise ValueError(f"bad case {(step, layout, batch)}: step 0-3, layout 'vd'/'dv', batch >= 1")
        if step == 3:
            need_layout("step03_row_skip", layout)
    code = ("import json, sys, triton\n"  # triton first: its library functions must be compilable
            "from book.masked_lm_head.ptx import _loads_here\n"
            "cases = [tuple(c) for c in json.loads(sys.argv[1])]\n"
            "print(json.dumps([_loads_here(*c) for c in cases]))\n")
    counts = _offline(code, json.dumps([list(c) for c in cases]))
    return {tuple(c): n for c, n in zip(cases, counts)}


def ptx_row_load_groups(steps: Sequence[int] = (4, 5), rows: int = 2) -> dict[int, list[int]]:
    """For the batch-1 steps 4 and 5, compiled for sm_90 with ``rows`` rows per program and D = 3072:
    the weight-row load instructions of a program, grouped by the barriers between them. ``[2, 2, 2]``
    means two loads, a barrier, two more, a barrier, two more: the program waits for memory three times
    in a row. ``[8]``: every row load is issued before the first barrier. No GPU is needed."""
    for step in steps:
        if step not in (4, 5):
            raise ValueError(f"step must be 4 or 5, got {step!r}")
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"rows must be a power of two, got {rows}")
    code = ("import json, sys, triton\n"
            "from book.masked_lm_head.ptx import _row_load_groups_here\n"
            "print(json.dumps([_row_load_groups_here(s, int(sys.argv[2])) for s in json.loads(sys.argv[1])]))\n")
    groups = _offline(code, json.dumps(list(steps)), str(rows))
    return dict(zip(steps, groups))


def _row_load_groups_here(step: int, rows: int) -> list[int]:
    import inspect
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = {4: compact_rows_kernel, 5: one_wait_kernel}[step]
    raw = getattr(kernel, "fn", kernel)
    fn = _compilable(kernel)
    # the source lines of the statement that loads the weight rows ("w = tl.load(...)", 1-2 lines): in step 4's
    # kernel, in step 5's row helper (inlined: its PTX lines name the helper's lines)
    loader = {4: compact_rows_kernel, 5: one_wait_rows}[step]
    lines, first = inspect.getsourcelines(getattr(loader, "fn", loader))
    start = next(i for i, text in enumerate(lines) if text.strip().startswith("w = tl.load("))
    w_lines = {first + start, first + start + 1}
    constexprs = {"D": HIDDEN, "BLOCK_V": rows, "FILL_BLOCK": 4096}
    constexprs |= {"BLOCK_D": 1024} if step == 4 else {"D_POW2": triton.next_power_of_2(HIDDEN), "EVICTION": ""}
    types = dict(h_ptr="*bf16", w_ptr="*bf16", out_ptr="*fp32", allowed_ptr="*u8", ids_ptr="*i32", n_ids="i32",
                 V="i32", n_compute="i32", n_fill="i32", stride_wv="i32")
    signature = {name: ("constexpr" if name in constexprs else types[name]) for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in fn.arg_names
             if name not in constexprs and name not in ("n_ids", "n_compute", "n_fill")}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1})
    ptx = compiled.asm["ptx"]
    kernel_file = re.escape(os.path.basename(inspect.getsourcefile(raw)))
    source_file = {m.group(1) for m in re.finditer(r'\.file\s+(\d+)\s+"[^"]*\b' + kernel_file + '"', ptx)}
    groups: list[int] = []
    current, line_now = 0, None
    for text in ptx.splitlines():
        text = text.strip()
        loc = re.match(r"\.loc\s+(\d+)\s+(\d+)", text)
        if loc:
            line_now = int(loc.group(2)) if loc.group(1) in source_file else None
        elif text.startswith("bar.sync") and current:
            groups.append(current)
            current = 0
        elif re.search(r"ld\.global\S*\.v\d", text) and line_now in w_lines:
            current += 1
    if current:
        groups.append(current)
    return groups


def _loads_here(step: int, layout: str, batch: int) -> dict[str, int]:
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = {0: dense_matmul_kernel, 1: block_skip_kernel, 2: block_skip_kernel, 3: row_skip_kernel}[step]
    fn = _compilable(kernel)
    t = default_tiles(step, batch)
    types = dict(a_ptr="*bf16", b_ptr="*bf16", c_ptr="*fp32", allowed_ptr="*u8", M="i32", N="i32", K="i32",
                 stride_am="i32", stride_ak="i32", stride_bk="i32", stride_bn="i32", stride_cm="i32",
                 stride_cn="i32", stride_allowed_m="i32")
    constexprs = dict(BLOCK_M=t.block_b, BLOCK_N=t.block_v, BLOCK_K=t.block_d, GROUP_M=t.group,
                      DOT_DTYPE=tl.bfloat16)
    if step in (1, 2):  # one kernel, its knob at the step's value
        constexprs["COLUMN_SKIP"] = step == 2
    # Triton's launcher turns integer arguments equal to 1 into constants, and marks pointers and
    # integers divisible by 16 as such (all of ours but the batch size): do the same here
    unit = ("stride_ak", "stride_cn", "stride_bk" if layout == "vd" else "stride_bn")
    constexprs |= {name: 1 for name in unit if name in fn.arg_names}
    signature = {name: ("constexpr" if name in constexprs else types[name]) for name in fn.arg_names}
    aligned = [name for name in fn.arg_names if name not in constexprs and name != "M"]
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": t.num_warps, "num_stages": t.num_stages})
    ptx = compiled.asm["ptx"]
    counts: dict[str, int] = {}
    copy = r"cp\.async\.c[ag]\.shared\.global(?:\.[\w:]+)* \[[^\]]+\], \[[^\]]+\], (0x[0-9a-f]+|\d+)"
    for m in re.finditer(copy, ptx):
        key = f"cp.async {int(m.group(1), 0)} B"
        counts[key] = counts.get(key, 0) + 1
    for m in re.finditer(r"ld\.global(?:\.\w+)*?(?:\.v(\d))?\.b(\d+)\s", ptx):
        key = f"ld {int(m.group(1) or 1) * int(m.group(2)) // 8} B"
        counts[key] = counts.get(key, 0) + 1
    return counts
