"""Where step 10's time goes at the chapter's worst loss: batch 256, about 80 allowed tokens a sequence, 111 in the
batch's union (the point where the entry point, step 12, runs step 10 and loses to ``index_select``).

Step 10 is one grid of two kinds of program: row programs (the union's rows times the batch's hidden states) and
fill programs (``-inf`` over every output their sequence does not allow, reading the ``[B, V]`` uint8 mask to know
which). The chapter's accounting charges the union's rows and the fp32 output at the copy bandwidth and leaves the
rest unexplained. This script times, on the GPU clock (CUDA-graph replay, outputs rotated over copies that together
exceed four times L2, as the chapter's benchmark does):

- ``step10``: the whole call (``step10_batched``), its output checked against float64 first;
- ``rows_only``: the same kernel launched with only its row programs;
- ``fill_only``: the same kernel launched with only its fill programs (what the fill costs as compiled);
- ``fill_rows_variant``: a variant of the fill programs on a 2D grid (no division by V), not the library's;
- ``fill_all_variant``, ``fill_all_then_rows_variant``: a second variant: ``-inf`` over every output with no mask
  read and no per-output predicate, then the row programs in a launch of their own (not the library's);
- ``torch_fill``: ``out.fill_(-inf)``, the same fp32 bytes written with nothing read (a write-only floor);
- ``mask_read``: the uint8 ``[B, V]`` mask read by ``studylog.bench.read_only`` (the fastest plain read): the fill
  programs' extra read alone.

The sets are synthetic with the worst point's shape: 256 sequences, each ``PER_SEQ`` ids drawn from one pool of
``UNION`` ids (the chapter's point has real grammar masks with that union and mean count); step 10's work depends on
the union's size, the batch and the vocabulary, not on which ids they are.

    PYTHONPATH=$PWD python lab/masked_lm_head/worst_point_parts.py --out DIR    # GPU -> DIR/<gpu>/worst_point_parts.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from studylog import runtime  # noqa: I001  (before triton: it selects GPU or interpreter)

import numpy as np
import torch
import triton
import triton.language as tl

from studylog.bench import BenchRun, read_only, write_lab_output
from studylog.masked_lm_head import HIDDEN, VOCAB, AllowedTokens, batched_union_kernel, check_logits, step10_batched
from studylog.masked_lm_head.formats import default_tiles, dot_dtype

BATCH, UNION, PER_SEQ, SEED = 256, 111, 80, 2024


@triton.jit
def fill_rows_kernel(out_ptr, allowed_ptr, V, stride_ob, stride_allowed_b, FILL_BLOCK: tl.constexpr):
    """A variant of step 10's fill programs (not the library's): a 2D grid, one program a (sequence, block of the
    vocabulary), so no program divides a flat offset by V to find its sequence."""
    seq, blk = tl.program_id(0), tl.program_id(1)
    tok = blk * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
    inside = tok < V
    keep = tl.load(allowed_ptr + seq * stride_allowed_b + tok, mask=inside, other=1)
    tl.store(out_ptr + seq * stride_ob + tok, tl.full((FILL_BLOCK,), float("-inf"), tl.float32),
             mask=inside & (keep == 0))


@triton.jit
def fill_all_kernel(out_ptr, n, FILL_BLOCK: tl.constexpr):
    """A second variant (not the library's): ``-inf`` over every output, no mask read, one predicate (the end): the
    row programs would then have to run after it, in a launch of their own."""
    offs = tl.program_id(0) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
    tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=offs < n)


def fill_all_then_rows(h, w, allowed: AllowedTokens, out, *, rows: bool = True) -> None:
    block = default_tiles(10, out.shape[0], allowed.union_count).fill_block
    fill_all_kernel[(triton.cdiv(out.numel(), block),)](out, out.numel(), FILL_BLOCK=block)
    if rows:
        launch(h, w, allowed, out, rows=True, fill=False)


def fill_rows(allowed: AllowedTokens, out) -> None:
    batch, vocab = out.shape
    block = default_tiles(10, batch, allowed.union_count).fill_block
    fill_rows_kernel[(batch, triton.cdiv(vocab, block))](out, allowed.mask_u8, vocab, out.stride(0),
                                                         allowed.mask.stride(0), FILL_BLOCK=block)


def launch(h, w, allowed: AllowedTokens, out, *, rows: bool, fill: bool) -> None:
    """``batched_union_kernel`` as ``step10_batched`` launches it, with only the programs asked for."""
    batch, vocab = out.shape
    t = default_tiles(10, batch, allowed.union_count)
    n_compute = triton.cdiv(allowed.union_count, t.block_v) * triton.cdiv(batch, t.block_b)
    n_fill = triton.cdiv(batch * vocab, t.fill_block)
    # fill only: no row programs (n_compute = 0, so every program is a fill program); rows only: the grid stops
    # before the first fill program
    grid = (n_compute if rows else 0) + (n_fill if fill else 0)
    batched_union_kernel[(grid,)](
        h, w, out, allowed.mask_u8, allowed.kernel_ids, allowed.union_count, batch, vocab,
        n_compute if rows else 0, h.stride(0), w.stride(0), out.stride(0), allowed.mask.stride(0),
        D=HIDDEN, BLOCK_B=t.block_b, BLOCK_V=t.block_v, BLOCK_D=t.block_d, FILL_BLOCK=t.fill_block,
        num_warps=t.num_warps, num_stages=t.num_stages, DOT_DTYPE=dot_dtype(h.dtype))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    run = BenchRun("masked_lm_head", command="lab/masked_lm_head/worst_point_parts.py")
    gen = np.random.default_rng(SEED)
    pool = np.sort(gen.choice(VOCAB, size=UNION, replace=False))
    sets = [np.sort(gen.choice(pool, size=PER_SEQ, replace=False)) for _ in range(BATCH)]
    dev = torch.device("cuda")
    allowed = AllowedTokens.from_ids(sets, VOCAB, device=dev)
    g = torch.Generator(device=dev).manual_seed(SEED)
    w = (torch.randn(VOCAB, HIDDEN, device=dev, generator=g) * HIDDEN ** -0.5).to(torch.bfloat16)
    h = torch.randn(BATCH, HIDDEN, device=dev, generator=g).to(torch.bfloat16)
    out_bytes = BATCH * VOCAB * 4
    outs = [torch.empty(BATCH, VOCAB, dtype=torch.float32, device=dev) for _ in range(run.rotation(out_bytes))]

    # checks first: the whole call and the two halves launched apart, each on a NaN-poisoned output
    whole = step10_batched(h, w, allowed, out=outs[0].fill_(float("nan")))
    result = check_logits(whole, h, w, allowed)
    run.check("step10_batched matches the float64 reference", bool(result["passed"]), params={}, **{
        k: v for k, v in result.items() if k != "passed" and isinstance(v, (int, float, bool))})
    whole = whole.clone()
    halves = outs[1 % len(outs)].fill_(float("nan"))
    launch(h, w, allowed, halves, rows=True, fill=False)
    launch(h, w, allowed, halves, rows=False, fill=True)
    run.check("rows-only then fill-only write the whole call's output bit for bit", bool(torch.equal(halves, whole)),
              params={})
    variant = outs[1 % len(outs)].fill_(float("nan"))
    launch(h, w, allowed, variant, rows=True, fill=False)
    fill_rows(allowed, variant)
    run.check("rows-only then the 2D-grid fill write the whole call's output bit for bit",
              bool(torch.equal(variant, whole)), params={})
    fill_all_then_rows(h, w, allowed, variant.fill_(float("nan")))
    run.check("a fill of every output, then the row programs, write the whole call's output bit for bit",
              bool(torch.equal(variant, whole)), params={})

    mask = allowed.mask_u8
    params = {"batch": BATCH, "union": allowed.union_count, "allowed_mean": float(np.mean(allowed.counts))}
    parts = {
        "step10": lambda o: (lambda: step10_batched(h, w, allowed, out=o)),
        "rows_only": lambda o: (lambda: launch(h, w, allowed, o, rows=True, fill=False)),
        "fill_only": lambda o: (lambda: launch(h, w, allowed, o, rows=False, fill=True)),
        "fill_rows_variant": lambda o: (lambda: fill_rows(allowed, o)),
        "fill_all_variant": lambda o: (lambda: fill_all_then_rows(h, w, allowed, o, rows=False)),
        "fill_all_then_rows_variant": lambda o: (lambda: fill_all_then_rows(h, w, allowed, o)),
        "torch_fill": lambda o: (lambda: o.fill_(float("-inf"))),
    }
    for series, make in parts.items():
        run.record(series, run.gpu_time(lambda make=make: [make(o) for o in outs]), params=params,
                   floor_ms=run.floor_ms(out_bytes), out_bytes=out_bytes)
    masks = [mask.clone() for _ in range(run.rotation(mask.numel()))]
    run.record("mask_read", run.gpu_time(lambda: [read_only(m) for m in masks]),
               params=params, floor_ms=run.floor_ms(mask.numel()), mask_bytes=mask.numel())
    run.note("Synthetic sets of the chapter's worst point's shape (see the docstring); times in ms a call.")
    path = write_lab_output(args.out, run.device["name"], "worst_point_parts", run.to_json())
    for r in run.rows:
        print(f"{r['series']:>12}: {r['ms'] * 1e3:8.2f} µs (floor {r.get('floor_ms', 0) * 1e3:.2f})")
    print("checks:", [(c["name"], c["passed"]) for c in run.checks], "->", path)


if __name__ == "__main__":
    main()
