"""Does an edit of chapter 2's Triton kernels change the PTX Triton makes of them?

Compiles the kernels of the given modules (dense.py, reorder.py, compact.py, plan.py) for sm_90 without a GPU
(``triton.compile`` with an explicit target), twice: the package as it is at ``--base`` (default HEAD; exported to a
temporary folder, so a module there imports that revision's helpers too) and as it is in the working tree, each in
a process of its own, and compares the PTX with what only names source lines left out (``.file``/``.loc``,
``$L__tmp`` labels, the DWARF sections): a ``@triton.jit`` helper is inlined, so moving code into one must leave the
code unchanged.

    .venv/bin/python lab/masked_lm_head/ptx_unchanged.py [--base REV] studylog/masked_lm_head/dense.py ...

Prints one line per kernel (a kernel only one side defines is named as such) and exits with status 1 when any
differs. One configuration per kernel: bf16, the tiles of a small decode batch, D = 3072.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

# studylog selects Triton's interpreter when torch sees no GPU; the kernels must be JIT functions here, compiled
# for an explicit target, so the check says there is one before studylog is imported.
torch.cuda.is_available = lambda: True
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from studylog import runtime  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
MATMUL = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, DOT_DTYPE=tl.bfloat16)
ROW = dict(D=3072, D_POW2=4096, BLOCK_V=1, FILL_BLOCK=4096)
STREAM = ROW | dict(EVICTION="evict_first")
UNION = dict(D=3072, BLOCK_B=16, BLOCK_V=64, BLOCK_D=128, FILL_BLOCK=4096)
BATCHED = UNION | dict(DOT_DTYPE=tl.bfloat16)
#: Pointer parameters by name (every other runtime parameter is an i32).
POINTERS = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*fp32", "allowed_ptr": "*u8", "perm_ptr": "*i32",
            "h_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*fp32", "ids_ptr": "*i32", "union_ptr": "*i32",
            "bitmask_ptr": "*i32", "count_ptr": "*i32", "mask_ptr": "*u8"}
#: Kernel name -> its constexprs, for every kernel a module may define.
KERNELS = {"dense_matmul_kernel": MATMUL, "block_skip_kernel": MATMUL | dict(COLUMN_SKIP=True),
           "row_skip_kernel": MATMUL, "reordered_rows_kernel": MATMUL,
           "compact_rows_kernel": dict(D=3072, BLOCK_V=1, BLOCK_D=1024, FILL_BLOCK=4096),
           "one_wait_kernel": ROW | dict(EVICTION=""), "fill_first_kernel": ROW,
           "few_ids_kernel": dict(D=3072, D_POW2=4096, FILL_BLOCK=1024, EVICTION="evict_first"),
           "union_sums_kernel": UNION, "batched_union_kernel": BATCHED,
           "stream_count_kernel": STREAM, "batched_count_kernel": BATCHED,
           "union_ids_kernel": dict(BLOCK_W=32, BLOCK_B=16), "apply_bitmask_kernel": dict(FILL_BLOCK=4096),
           "unpack_bitmask_kernel": dict(FILL_BLOCK=4096)}


def ptx(fn, constexprs: dict) -> str:
    names = [p.name for p in fn.params]
    constexprs = {k: v for k, v in constexprs.items() if k in names}  # a knob the other version lacks
    signature = {n: "constexpr" if n in constexprs else POINTERS.get(n, "i32") for n in names}
    source = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    text = triton.compile(source, target=TARGET, options={"num_warps": 4, "num_stages": 3}).asm["ptx"]
    text = text.split(".section\t.debug")[0]
    return "\n".join(line for line in text.splitlines()
                     if not re.match(r"\s*\.(file|loc)\b", line) and not re.match(r"\$L__tmp\d+:", line))


def dump(modules: list[str]) -> dict[str, dict[str, str]]:
    """Each module's kernels' PTX, the package being the one this process imports."""
    assert runtime.MODE == "gpu", runtime.MODE
    out = {}
    for rel in modules:
        module = importlib.import_module(rel.removesuffix(".py").replace("/", "."))
        out[rel] = {kernel: ptx(getattr(module, kernel), constexprs) for kernel, constexprs in KERNELS.items()
                    if hasattr(module, kernel)}
    return out


def side(root: str, modules: list[str]) -> dict[str, dict[str, str]]:
    """:func:`dump` in a process that imports the package under ``root``."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, __file__, "--dump", f.name, *modules], check=True,
                       env=os.environ | {"PYTHONPATH": root})
        return json.load(open(f.name))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the revision to compare against (default HEAD)")
    parser.add_argument("--dump", help=argparse.SUPPRESS)  # one side's run, writing its PTX here as JSON
    parser.add_argument("modules", nargs="+")
    args = parser.parse_args(argv)
    if args.dump:
        json.dump(dump(args.modules), open(args.dump, "w"))
        return 0
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                         check=True).stdout.strip()
    base = tempfile.mkdtemp()
    archive = subprocess.run(["git", "archive", args.base, "studylog"], capture_output=True, check=True, cwd=top)
    subprocess.run(["tar", "-x", "-C", base], input=archive.stdout, check=True)
    old, new = side(base, args.modules), side(top, args.modules)
    same = True
    for rel in args.modules:
        for kernel in [k for k in KERNELS if k in old[rel] or k in new[rel]]:
            if kernel not in old[rel] or kernel not in new[rel]:
                where = "in the working tree" if kernel in new[rel] else f"at {args.base}"
                print(f"{rel:45s} {kernel:28s} only {where}")
                continue
            ok = old[rel][kernel] == new[rel][kernel]
            same &= ok
            print(f"{rel:45s} {kernel:28s} PTX {'same' if ok else 'DIFFERS'}")
    print(f"every kernel the same PTX ({args.base} -> working tree, sm_90)" if same else "SOMETHING DIFFERS")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
