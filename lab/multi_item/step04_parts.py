"""Step 4 of chapter 6 in three parts, each one change that runs alone (not run by the tests or the bench).

Step 4 replaces step 3's one loop over every key tile by three ranges (``attend_visible_tiles`` in
``studylog/multi_item/steps.py``). Its three changes are taken here one at a time, each a range function with
``attend_visible_tiles``' signature that calls the library's own loop over a range, ``attend_key_tiles``:

* **4a** (:func:`visible_tiles_4a`): step 3's loop stopped at the diagonal: no key tile right of the query tile's
  last row is loaded;
* **4b** (:func:`visible_tiles_4b`): two ranges, the prefix up to the diagonal and the items from the first key the
  tile's first item row sees: the tiles between the prefix's end and that key are never loaded;
* **4c**: the library's step 4 (``attend_visible_tiles``): the prefix tiles every row sees whole get a range of
  their own, without the mask's arithmetic.

:func:`attn_fwd_part` is step 4's program (``attend_query_tile``) with the range function a constexpr ``PART``
(1: 4a, 2: 4b, 3: the library's ``attend_visible_tiles``, so part 3 must equal step 4 bit for bit).

    PYTHONPATH=$PWD python lab/multi_item/step04_parts.py check     # CPU (interpreter) or GPU
    PYTHONPATH=$PWD python lab/multi_item/step04_parts.py measure   # GPU -> results/<gpu>/step04_parts.json

``measure`` times, on the benchmark's inputs, clock and check (as ``step_changes.py measure`` does), the library's
steps 3 and 4 (anchors, at the configuration the benchmark runs them at) and 4a, 4b at step 4's configuration, on the
two one-prompt shapes; every output is checked against the float32 reference first.
"""

import json
import math
import sys
from typing import Any, Callable

import torch

from studylog import paths, runtime  # first: it sets TRITON_INTERPRET on a CPU before Triton's kernels are defined

import triton
import triton.language as tl
from studylog import multi_item as mi
from studylog.bench import BenchRun, gpu_slug
from studylog.multi_item import report
from studylog.multi_item.config import find_config, strides
from studylog.multi_item.formats import DEFAULT_RULE, ITEM_KEYS_FROM, MultiItemBatch
from studylog.multi_item.steps import (attend_key_tiles, attend_visible_tiles, item_row_start, launch,
                                       prepare_launch, query_tile, softmax_start, store_rows)

STEP = {s.number: s for s in mi.CHAPTER.steps}
#: the parts by label: the constexpr PART of :func:`attn_fwd_part`
PARTS = {"4a": 1, "4b": 2}
#: the one-prompt shapes of the benchmark, where step 4 runs as one launch
SHAPES = ("prefix 2048, 32 items x 32", "prefix 512, 128 items x 16")


@triton.jit
def visible_tiles_4a(
    acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start, Pos, m_lo, m_hi, prefix_len, seq_len,
    qk_scale,
    SKIP_DELIMITER: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """4a: step 3's loop over the key tiles, stopped at the diagonal."""
    # every key tile up to the diagonal, with the mask
    acc, l_i, m_i = attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                     prefix_len, seq_len, 0, m_hi, qk_scale,
                                     True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    visited = tl.cdiv(m_hi, BLOCK_N)
    return acc, l_i, m_i, visited


@triton.jit
def visible_tiles_4b(
    acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start, Pos, m_lo, m_hi, prefix_len, seq_len,
    qk_scale,
    SKIP_DELIMITER: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """4b: the prefix up to the diagonal, then the items from the first key the first item row sees."""
    # 1. the prefix, up to the diagonal
    prefix_hi = tl.cdiv(tl.minimum(prefix_len, m_hi), BLOCK_N) * BLOCK_N
    acc, l_i, m_i = attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                     prefix_len, seq_len, 0, prefix_hi, qk_scale,
                                     True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 2. the items, from the first key the first item row's item shows it (row starts never decrease down the
    # rows): the tiles between are never loaded
    first_item_row = tl.maximum(m_lo, prefix_len)
    items_lo = first_item_row + SKIP_DELIMITER - tl.load(Pos + first_item_row - prefix_len)
    items_lo = tl.maximum((items_lo // BLOCK_N) * BLOCK_N, prefix_hi)
    acc, l_i, m_i = attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                     prefix_len, seq_len, items_lo, m_hi, qk_scale,
                                     True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    visited = prefix_hi // BLOCK_N + tl.maximum(tl.cdiv(m_hi - items_lo, BLOCK_N), 0)
    return acc, l_i, m_i, visited


@triton.jit
def attn_fwd_part(
    Q, K, V, Out, Pos,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    seq_len, prefix_len, qk_scale,
    HEAD_DIM: tl.constexpr, KV_GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr, SKIP_DELIMITER: tl.constexpr,
    PART: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Step 4's program (``attend_query_tile``, without the tile counts) over one prompt, its ranges those of
    ``PART``: 1 is 4a, 2 is 4b, 3 the library's step 4."""
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    offs_m, _, offs_d, row_ok, q, k_base, v_base = query_tile(Q, K, V, start_m, off_h, seq_len, stride_qh, stride_qt,
        stride_kh, stride_vh, HEAD_DIM, KV_GROUP, BLOCK_M, BLOCK_N)
    row_start = item_row_start(Pos, offs_m, row_ok, prefix_len, SKIP_DELIMITER)
    m_i, l_i, acc = softmax_start(BLOCK_M, HEAD_DIM)
    m_lo = start_m * BLOCK_M
    m_hi = tl.minimum(m_lo + BLOCK_M, seq_len)
    if PART == 1:
        acc, l_i, m_i, visited = visible_tiles_4a(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m,
                                                  row_start, Pos, m_lo, m_hi, prefix_len, seq_len, qk_scale,
                                                  SKIP_DELIMITER, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    elif PART == 2:
        acc, l_i, m_i, visited = visible_tiles_4b(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m,
                                                  row_start, Pos, m_lo, m_hi, prefix_len, seq_len, qk_scale,
                                                  SKIP_DELIMITER, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    else:
        acc, l_i, m_i, visited = attend_visible_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m,
                                                      row_start, Pos, m_lo, m_hi, prefix_len, seq_len, qk_scale,
                                                      SKIP_DELIMITER, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    store_rows(Out, off_h, offs_m, offs_d, stride_oh, stride_ot, acc, l_i, row_ok)


def step04_part(q, k, v, batch: MultiItemBatch, part: int, *, sm_scale: float | None = None, out=None,
                blocks=None, config: str | None = None, rule: str = DEFAULT_RULE):
    """One prompt through :func:`attn_fwd_part` at ``part`` (1, 2 or 3), launched as step 4 is."""
    if part not in (1, 2, 3):
        raise ValueError(f"part must be 1, 2 or 3, got {part!r}")
    qk_scale, out, common = prepare_launch("step04_part", q, k, v, batch, sm_scale, out, blocks, rule,
                                           one_prompt=True)
    common.update(SKIP_DELIMITER=ITEM_KEYS_FROM[rule], PART=part)
    args = [q, k, v, out, batch.token_pos[0], *strides(q, k, v, out), batch.seq_lens[0], batch.prefix_lens[0],
            qk_scale]
    grid = lambda meta: (triton.cdiv(batch.seq_lens[0], meta["BLOCK_M"]), q.shape[0])  # noqa: E731
    if config is None and blocks is None and runtime.mode() == "gpu":
        raise ValueError("on the GPU give config= or blocks= (the parts are not autotuned)")
    launch(attn_fwd_part, grid, args, common, blocks, find_config(config, blocks))
    return out


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------

#: one-prompt batches: sizes no tile divides, an empty prefix, one-token items, a prompt of prefix only, long items
CHECK_BATCHES = [([37], [[5, 1, 19, 3, 8]]), ([0], [[1, 1, 2, 7]]), ([70], [[33, 2] + [1] * 20]),
                 ([45], [[]]), ([20], [[60, 3, 41]])]
CHECK_BLOCKS = [(16, 16), (32, 16), (16, 32), (64, 32)]


def _close(got, want, tol: float) -> bool:
    return not torch.isnan(got).any() and bool(torch.allclose(got.double().cpu(), want.cpu(), rtol=tol, atol=tol))


def check(seed: int = 0) -> int:
    """4a and 4b against the float64 reference (1e-5 in float32) at several tile shapes, and part 3 (the library's
    ranges in this program) bit-identical to the library's step 4. Returns the number of failures."""
    dev = runtime.device()
    gen = torch.Generator().manual_seed(seed)
    failures = checks = 0
    for prefixes, items in CHECK_BATCHES:
        batch = MultiItemBatch.from_item_lens(prefixes, items, device=dev)
        for head_dim in (16, 32):
            q, k, v = (torch.randn(2, batch.total_tokens, head_dim, generator=gen).to(dev) for _ in range(3))
            want = mi.reference_attention(q, k, v, batch)
            for blocks in CHECK_BLOCKS:
                library = STEP[4].function(q, k, v, batch, blocks=blocks)
                for label, part in (*PARTS.items(), ("part 3", 3)):
                    got = step04_part(q, k, v, batch, part, blocks=blocks, out=torch.full_like(q, math.nan))
                    ok = _close(got, want, 1e-5) and (part != 3 or torch.equal(got, library))
                    checks += 1
                    if not ok:
                        failures += 1
                        print("FAILED", label, prefixes, items, f"d={head_dim}", blocks)
    print(f"step 4's parts ({runtime.mode()}): {checks} checks, {failures} failures")
    return failures


# ---------------------------------------------------------------------------------------------
# measure
# ---------------------------------------------------------------------------------------------

def measure() -> str:
    """The library's steps 3 and 4 and the parts 4a, 4b on the one-prompt shapes, on the benchmark's clock, every
    output checked first; writes ``results/<gpu>/step04_parts.json``."""
    from studylog.plotting import load_results

    run = BenchRun("multi_item", command=" ".join(sys.argv))
    try:
        pins = report.pinned_configs(load_results("multi_item", gpu=gpu_slug(run.device["name"])))
    except FileNotFoundError:
        pins = {}
    run.note("parts: series 'step04 part' with the part in params; anchors: the library's steps 3 and 4 under "
             "their own series, at the config the benchmark runs them at (config_source); the parts at step 4's")
    shapes = {name: (p, i) for name, p, i in report.bench_shapes()}
    heads, head_dim, dtype = report.BENCH_HEADS, report.BENCH_HEAD_DIM, report.BENCH_DTYPE
    sm_scale = 1.0 / math.sqrt(head_dim)
    summary: dict[str, Any] = {}
    for shape in run.progress(list(SHAPES), "shapes"):
        dev = runtime.device()
        batch = MultiItemBatch.from_item_lens(*shapes[shape], device=dev)
        T = batch.total_tokens
        params = {"shape": shape, "prompts": batch.batch_size, "tokens": T}
        gen = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(heads, T, head_dim, dtype=dtype, device=dev, generator=gen) for _ in range(3))
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        ref = torch.empty(heads, T, head_dim, dtype=torch.float32, device=dev)
        mi.step01_dense_sdpa(q.float(), k.float(), v.float(), batch, sm_scale=sm_scale, out=ref)

        def checked(label: str, got, knobs: dict) -> bool:
            err = (got.float() - ref).abs()
            bad = int((err > 1e-2 + 1.6e-2 * ref.abs()).sum()) + int(torch.isnan(got).sum())
            return run.check(f"{label} matches the float32 reference ({DEFAULT_RULE} rule)", bad == 0,
                             params=params | knobs, max_abs_err=float(err.max()), bad_elements=bad)

        def timed(series: str, function: Callable, knobs: dict, **extra: Any) -> float:
            """``function(q, k, v, out)`` on the benchmark's clock over fresh rotated inputs (as report.bench)."""
            def make_calls():
                qkv = torch.randn(3 * heads * T * head_dim, dtype=dtype, device=dev)
                calls = []
                for c in run.rotated(qkv):
                    qq, kk, vv = (x.view(heads, T, head_dim) for x in c.split(heads * T * head_dim))
                    o = torch.empty_like(qq)
                    calls.append(lambda qq=qq, kk=kk, vv=vv, o=o: function(qq, kk, vv, o))
                return calls
            probe = make_calls()
            calls = report.graph_calls_for(run.graph_time(probe, min_calls=len(probe), reps=2))
            first = [probe]
            timing = run.gpu_time(lambda: first.pop() if first else make_calls(), min_calls=calls, reps=10)
            run.record(series, timing, params=params | knobs, role="kernel", floor_ms=run.floor_ms(nbytes),
                       graph_calls=calls, **extra)
            print(f"  {shape} | {series} {knobs}: {timing.median * 1e3:,.1f} us", flush=True)
            return timing.median

        configs = {}
        for number in (3, 4):  # the anchors, as the benchmark runs them
            step = STEP[number]
            config, source = pins.get((step.series, shape)), "pinned"
            if config is None:
                _, info = step.function(q, k, v, batch, sm_scale=sm_scale, return_info=True)
                config, source = info.config, "autotuned"
            configs[number] = config
            checked(step.name, step.function(q, k, v, batch, sm_scale=sm_scale, config=config), {})
            summary[f"{shape} | step {number}"] = {"config": config, "ms": timed(
                step.series, lambda qq, kk, vv, o, f=step.function, c=config:
                f(qq, kk, vv, batch, sm_scale=sm_scale, out=o, config=c), {}, config=config, config_source=source)}
        library = STEP[4].function(q, k, v, batch, sm_scale=sm_scale, config=configs[4])
        same = step04_part(q, k, v, batch, 3, sm_scale=sm_scale, config=configs[4])
        run.check("part 3 (the library's ranges in this program) is bit-identical to step 4", torch.equal(same, library),
                  params=params)
        for label, part in PARTS.items():
            knobs = {"part": label, "config": configs[4]}
            checked(f"step 4, {label}", step04_part(q, k, v, batch, part, sm_scale=sm_scale, config=configs[4]),
                    knobs)
            summary[f"{shape} | {label}"] = {"config": configs[4], "ms": timed(
                "step04 part", lambda qq, kk, vv, o, p=part:
                step04_part(qq, kk, vv, batch, p, sm_scale=sm_scale, out=o, config=configs[4]), knobs)}
        del q, k, v, ref
        torch.cuda.empty_cache()
    result = run.to_json()
    result["summary"] = summary
    out = paths.lab_results("multi_item", gpu_slug(run.device["name"])) / "step04_parts.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    bad = [c for c in run.checks if not c["passed"]]
    for name, row in summary.items():
        print(f"{name}: {row['ms'] * 1e3:,.1f} us ({row['config']})")
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    return str(out)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "check"
    if what == "check":
        sys.exit(1 if check() else 0)
    elif what == "measure":
        measure()
    else:
        sys.exit(f"usage: {sys.argv[0]} check|measure")
