"""Chapter 6's exercises, each with a check that a reader runs on a CPU.

Every ``check_*`` function runs the reader's function on small random inputs against the chapter's rule (the dense
mask, a plain softmax, the tile accounting of :func:`tile_map`, the float64 reference), prints what is
wrong on the first input where it disagrees, and returns ``True`` when every input agrees. A function that still
raises ``NotImplementedError`` (the page's stub) gets a note instead of a traceback. The answers live in
:mod:`book.multi_item.solutions`, which the notebook does not import: try your own before reading them.

1. :func:`check_visible`: FlashInfer's multi-item mask for one (query, key) pair, from the metadata.
2. :func:`check_online_softmax`: a flash-attention row loop over key blocks that survives fully masked
   blocks and rows that see no key at all.
3. :func:`check_key_tiles`: which key tiles a query tile must load (step 4's three ranges).
4. :func:`check_max_programs`: the fixed grid of :class:`~studylog.multi_item.plan.MultiItemPlan`, the most
   programs any layout within a capacity can need.
5. :func:`check_tile_shape`: step 5 launched at a tile shape the reader picks; :func:`tile_shapes` counts the key
   tiles of each shape on the benchmark's batches and, on a GPU, times the reader's function.
6. :func:`check_items_lo`: the kernel's own code changed: the Triton function that says where a query tile's
   item loop starts, rewritten to FlashInfer's coarser bound (``m_lo - max_item_len``), run inside a copy of step
   4's kernel (Triton's interpreter on a CPU), its tiles counted, and timed against step 5 on a GPU.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor

from book.common import gpu_us, guarded, report
from studylog.multi_item.config import strides  # studylog first: it sets TRITON_INTERPRET on a CPU
from studylog.multi_item.formats import DEFAULT_RULE, ITEM_KEYS_FROM, MultiItemBatch, check_rule, dense_mask
from studylog.multi_item.steps import LOG2E, attend_key_tiles

import triton  # noqa: E402,I001
import triton.language as tl  # noqa: E402

__all__ = ["check_visible", "check_online_softmax", "check_key_tiles", "check_max_programs", "check_tile_shape",
           "check_items_lo", "tile_shapes", "tile_map", "TILE_SKIPPED", "TILE_WHOLE", "TILE_MASKED"]

TILE_SKIPPED, TILE_WHOLE, TILE_MASKED = 0, 1, 2  # tile_map's codes


def tile_map(batch: MultiItemBatch, block_m: int, block_n: int, prompt: int = 0, rule: str = DEFAULT_RULE) -> Tensor:
    """What steps 4 and 5 do with each (query tile, key tile) of one prompt, ``[query tiles, key tiles]``: the
    kernels' three loop ranges, in Python. ``TILE_WHOLE``: every row sees every key, no mask arithmetic."""
    skip = ITEM_KEYS_FROM[check_rule(rule)]
    s, p = batch.seq_lens[prompt], batch.prefix_lens[prompt]
    pos = batch.token_pos[prompt].tolist()
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    out = torch.full((cdiv(s, block_m), cdiv(s, block_n)), TILE_SKIPPED, dtype=torch.int8)
    for t, m_lo in enumerate(range(0, s, block_m)):
        m_hi = min(m_lo + block_m, s)
        full_hi = min(p, m_lo + 1) // block_n * block_n                     # phase 1: [0, full_hi)
        prefix_hi = cdiv(min(p, m_hi), block_n) * block_n                    # phase 2: [full_hi, prefix_hi)
        first_item_row = max(m_lo, p)
        items_lo = first_item_row + skip - pos[first_item_row - p]           # phase 3: [items_lo, m_hi)
        items_lo = max(items_lo // block_n * block_n, prefix_hi)
        out[t, : full_hi // block_n] = TILE_WHOLE
        out[t, full_hi // block_n: prefix_hi // block_n] = TILE_MASKED
        out[t, items_lo // block_n: cdiv(m_hi, block_n)] = TILE_MASKED
    return out


def _random_prompt(gen: torch.Generator) -> MultiItemBatch:
    """One prompt: a prefix of 0 to 12 tokens, 0 to 5 items of 1 to 6 tokens."""
    prefix = int(torch.randint(0, 13, (1,), generator=gen))
    items = torch.randint(1, 7, (int(torch.randint(0, 6, (1,), generator=gen)),), generator=gen).tolist()
    return MultiItemBatch.from_item_lens([prefix], [items], device="cpu")


def _positions(batch: MultiItemBatch) -> list[int]:
    """The prompt's ``token_pos_in_items`` without its padding: one entry per token from the prefix's end on."""
    return batch.token_pos[0, : batch.seq_lens[0] - batch.prefix_lens[0]].tolist()


# --------------------------------------------------------------------------------------
# 1. The mask from the metadata
# --------------------------------------------------------------------------------------

@guarded
def check_visible(fn: Callable[[int, int, int, Sequence[int]], bool], cases: int = 60) -> bool:
    """``fn(q, k, prefix_len, pos) -> bool`` for every (query, key) pair of random prompts, against the
    dense mask of FlashInfer's rule (:func:`~studylog.multi_item.formats.dense_mask`)."""
    gen = torch.Generator().manual_seed(6)
    for _ in range(cases):
        batch = _random_prompt(gen)
        p, pos, want = batch.prefix_lens[0], _positions(batch), dense_mask(batch).tolist()
        for q in range(batch.seq_lens[0]):
            for k in range(batch.seq_lens[0]):
                got = bool(fn(q, k, p, list(pos)))
                if got != want[q][k]:
                    return report("check_visible", False, f"prefix {p}, pos {pos}: query {q}, key {k} should "
                                   f"{'' if want[q][k] else 'not '}be visible", cases)
    return report("check_visible", True, None, cases)


# --------------------------------------------------------------------------------------
# 2. The online softmax over key blocks, with masked keys
# --------------------------------------------------------------------------------------

@guarded
def check_online_softmax(fn: Callable[[Tensor, Tensor, int], Tensor], cases: int = 40) -> bool:
    """``fn(scores [M, S], values [S, D], block_n) -> [M, D]``, against a plain masked softmax in float64;
    the inputs hold fully masked blocks, rows that see no key and block sizes that do not divide ``S``."""
    gen = torch.Generator().manual_seed(7)
    for case in range(cases):
        rows, keys, dim = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((1, 9), (1, 40), (1, 6)))
        block_n = int(torch.randint(1, 17, (1,), generator=gen))
        scores = torch.randn(rows, keys, generator=gen, dtype=torch.float64) * 4
        keep = torch.rand(rows, keys, generator=gen) < 0.6
        keep[:, :min(block_n, keys)] &= case % 2 == 0  # every other case: the first block masked for all rows
        keep[0] &= case % 3 != 0  # every third case: a row that sees nothing
        scores = scores.masked_fill(~keep, float("-inf"))
        values = torch.randn(keys, dim, generator=gen, dtype=torch.float64)
        want = torch.softmax(scores, dim=1).nan_to_num(0.0) @ values
        got = torch.as_tensor(fn(scores.clone(), values.clone(), block_n)).double()
        if got.shape != want.shape:
            return report("check_online_softmax", False, f"expected shape {tuple(want.shape)}, got "
                           f"{tuple(got.shape)}", cases)
        bad = ~torch.isclose(got, want, rtol=1e-9, atol=1e-9)
        if bad.any():
            r = int(bad.any(dim=1).nonzero()[0])
            seen = int(keep[r].sum())
            return report("check_online_softmax", False, f"{rows} rows, {keys} keys, block_n {block_n}: row {r} "
                           f"(sees {seen} keys) gives {got[r].tolist()}, expected {want[r].tolist()}", cases)
    return report("check_online_softmax", True, None, cases)


# --------------------------------------------------------------------------------------
# 3. The key tiles a query tile must load
# --------------------------------------------------------------------------------------

@guarded
def check_key_tiles(fn: Callable[[int, Sequence[int], int, int, int], Iterable[int]], cases: int = 80) -> bool:
    """``fn(prefix_len, pos, m_lo, m_hi, block_n) -> key tile indices``: it must name every key tile that holds
    a visible pair of the query tile's rows (or rows would be wrong), and no more tiles than step 4 loads."""
    gen = torch.Generator().manual_seed(8)
    for _ in range(cases):
        batch = _random_prompt(gen)
        block_m, block_n = (int(x) for x in torch.tensor([2, 4, 8])[torch.randint(0, 3, (2,), generator=gen)])
        s, p, pos = batch.seq_lens[0], batch.prefix_lens[0], _positions(batch)
        mask = dense_mask(batch)
        planned = tile_map(batch, block_m, block_n)
        for t, m_lo in enumerate(range(0, s, block_m)):
            m_hi = min(m_lo + block_m, s)
            got = set(int(x) for x in fn(p, list(pos), m_lo, m_hi, block_n))
            where = f"prefix {p}, pos {pos}, rows [{m_lo}, {m_hi}), {block_n}-key tiles"
            for n in range(-(-s // block_n)):
                holds = mask[m_lo:m_hi, n * block_n:(n + 1) * block_n].nonzero()
                if len(holds) and n not in got:
                    q, k = (int(x) for x in holds[0])
                    return report("check_key_tiles", False, f"{where}: tile {n} is skipped but row {m_lo + q} "
                                   f"sees key {n * block_n + k}", cases)
            most = int((planned[t] != TILE_SKIPPED).sum())
            if len(got) > most:
                return report("check_key_tiles", False, f"{where}: {len(got)} tiles {sorted(got)}, but step 4 "
                               f"loads only {most}", cases)
    return report("check_key_tiles", True, None, cases)


# --------------------------------------------------------------------------------------
# 4. A grid that fits every layout of a capacity
# --------------------------------------------------------------------------------------

def _most_tiles(max_tokens: int, max_prompts: int, block_m: int) -> tuple[int, list[int]]:
    """The true maximum of ``sum cdiv(S_b, block_m)`` over layouts within the capacity, and a layout that
    reaches it: ``b`` prompts of one token each but the first, which takes the rest."""
    best = (0, [])
    for b in range(1, min(max_prompts, max_tokens) + 1):
        lens = [max_tokens - (b - 1)] + [1] * (b - 1)
        tiles = sum(-(-s // block_m) for s in lens)
        best = max(best, (tiles, lens))
    return best


@guarded
def check_max_programs(fn: Callable[[int, int, int], int], cases: int = 300) -> bool:
    """``fn(max_tokens, max_prompts, block_m) -> programs per head``: enough for every layout within the
    capacity (a grid too small leaves query tiles uncomputed), and no looser than the chapter's bound (each extra
    program is an empty one the GPU still launches; the bound is the answer in :mod:`book.multi_item.solutions`)."""
    from book.multi_item.solutions import max_programs as loosest

    gen = torch.Generator().manual_seed(9)
    for _ in range(cases):
        tokens = int(torch.randint(1, 3000, (1,), generator=gen))
        prompts = int(torch.randint(1, 40, (1,), generator=gen))
        block_m = [16, 32, 64, 128][int(torch.randint(0, 4, (1,), generator=gen))]
        got, (need, layout) = int(fn(tokens, prompts, block_m)), _most_tiles(tokens, prompts, block_m)
        where = f"{tokens} tokens, {prompts} prompts, BLOCK_M {block_m}"
        if got < need:
            shown = layout if len(layout) <= 6 else layout[:3] + ["..."] + [f"({len(layout)} prompts)"]
            return report("check_max_programs", False, f"{where}: {got} programs, but prompts of {shown} tokens "
                           f"have {need} query tiles", cases)
        if got > loosest(tokens, prompts, block_m):
            return report("check_max_programs", False, f"{where}: {got} programs, more than the "
                           f"{loosest(tokens, prompts, block_m)} of the chapter's bound", cases)
    return report("check_max_programs", True, None, cases)


# --------------------------------------------------------------------------------------
# 5. Step 5 at a tile shape of your choice
# --------------------------------------------------------------------------------------

#: Tile shapes the check asks for in the interpreter: none divides the test prompts, and rows and keys differ.
CHECK_TILES = ((16, 16), (16, 32), (32, 16))


@guarded
def check_tile_shape(fn: Callable, tiles: Sequence[tuple[int, int]] = CHECK_TILES) -> bool:
    """``fn(q, k, v, batch, block_m, block_n) -> out``: step 5 launched with ``block_m`` query rows by ``block_n``
    keys per tile. On small batches in float32 (in Triton's interpreter on a CPU, or on the GPU), at every tile
    shape of ``tiles``: the launch must use the tile asked for (the check watches the step's launcher) and the
    output must match the float64 reference within 1e-5."""
    from studylog import runtime
    from studylog.multi_item import steps
    from studylog.multi_item.formats import reference_attention

    gen = torch.Generator().manual_seed(10)
    device = runtime.device()
    batches = [MultiItemBatch.from_item_lens([17, 0, 40], [[4, 9, 1], [6, 6], [3]], device=device),
               MultiItemBatch.from_item_lens([37], [[5, 13, 2, 8]], device=device)]
    launched: list[tuple[int, int]] = []
    real = steps.launch

    def spy(*args, **kwargs):
        got = real(*args, **kwargs)
        launched.append(got[:2])
        return got

    cases = len(batches) * len(tiles)
    steps.launch = spy
    try:
        for batch in batches:
            q, k, v = (torch.randn(2, batch.total_tokens, 16, generator=gen).to(device) for _ in range(3))
            want = reference_attention(q, k, v, batch)
            for block_m, block_n in tiles:
                launched.clear()
                out = torch.as_tensor(fn(q, k, v, batch, block_m, block_n))
                where = f"{batch.describe()}, tile {block_m} x {block_n}"
                if launched != [(block_m, block_n)]:
                    return report("check_tile_shape", False, f"{where}: the kernel launched with tiles {launched} "
                                  f"(pass the tile to the step)", cases)
                if out.shape != want.shape:
                    return report("check_tile_shape", False, f"{where}: output of shape {tuple(out.shape)}, "
                                  f"expected {tuple(want.shape)}", cases)
                error = (out.double() - want.double()).abs().max().item()
                if not error < 1e-5:
                    return report("check_tile_shape", False, f"{where}: max difference {error:.1e} to the float64 "
                                  "reference", cases)
    finally:
        steps.launch = real
    return report("check_tile_shape", True, None, cases)


def tile_shapes(fn: Callable, tiles: Sequence[tuple[int, int]] = ((64, 32), (64, 64), (128, 64), (128, 128))) -> None:
    """Exercise 5's table: on each of the benchmark's batches, at each tile shape, the key tiles step 5 visits per
    head and the share of their pairs that are visible; on a GPU, ``fn`` (``step5_at``) timed at that shape as well
    (bf16, 32 heads of dimension 128, as the benchmark runs)."""
    from studylog.multi_item.report import BENCH_DTYPE, BENCH_HEAD_DIM, BENCH_HEADS, bench_shapes
    from studylog.multi_item.tiles import tile_stats

    gpu = torch.cuda.is_available()
    for name, prefixes, items in bench_shapes():
        batch = MultiItemBatch.from_item_lens(prefixes, items, device="cpu")
        if gpu:
            on_gpu = MultiItemBatch.from_item_lens(prefixes, items, device="cuda")
            q, k, v = (torch.randn(BENCH_HEADS, batch.total_tokens, BENCH_HEAD_DIM, device="cuda", dtype=BENCH_DTYPE)
                       for _ in range(3))
        for block_m, block_n in tiles:
            s = tile_stats(batch, block_m, block_n)
            line = (f"{name.replace(' x ', ' × ')}, {block_m} × {block_n}: {s.visited:,} key tiles per head, "
                    f"{s.visible_pairs / (s.visited * block_m * block_n):.0%} of their pairs visible")
            if gpu:
                try:
                    args = (q, k, v, on_gpu, block_m, block_n)
                    line += f", {gpu_us(lambda args=args: fn(*args)):,.1f} µs"
                except NotImplementedError:
                    line += " (write step5_at above to time it)"
            print(line)
    if not gpu:
        print("timing needs a GPU: on a CPU the tile counts are what this cell can give")


# --------------------------------------------------------------------------------------
# 6. A kernel's loop bound, changed: FlashInfer's start of the items
# --------------------------------------------------------------------------------------

@triton.jit
def _attn_fwd_items_lo(
    Q, K, V, Out, Pos, TileCounts,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    seq_len, prefix_len, max_item_len, qk_scale,
    ITEMS_LO: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, SKIP_DELIMITER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Step 4's kernel (one prompt, a key head per query head) with its third loop starting where the reader's
    ``ITEMS_LO`` says; it counts the key tiles each query tile visits."""
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + off_h * stride_kh
    v_base = V + off_h * stride_vh
    in_items = row_ok & (offs_m >= prefix_len)
    row_start = offs_m + SKIP_DELIMITER - tl.load(Pos + offs_m - prefix_len, mask=in_items, other=0)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_lo = start_m * BLOCK_M
    m_hi = tl.minimum(m_lo + BLOCK_M, seq_len)
    prefix_hi = tl.cdiv(tl.minimum(prefix_len, m_hi), BLOCK_N) * BLOCK_N  # the prefix, up to the diagonal
    acc, l_i, m_i = attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                     prefix_len, seq_len, 0, prefix_hi, qk_scale,
                                     True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    items_lo = ITEMS_LO(m_lo, prefix_hi, Pos, prefix_len, max_item_len, SKIP_DELIMITER, BLOCK_N)  # the reader's
    acc, l_i, m_i = attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                     prefix_len, seq_len, items_lo, m_hi, qk_scale,
                                     True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    visited = prefix_hi // BLOCK_N + tl.maximum(tl.cdiv(m_hi - items_lo, BLOCK_N), 0)
    tl.store(TileCounts + start_m, visited, mask=off_h == 0)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


def _bound_tiles(batch: MultiItemBatch, block_m: int, block_n: int) -> list[int]:
    """Key tiles per query tile of one prompt when the items resume at ``m_lo - max_item_len`` (rounded down to
    a tile, never inside the prefix's tiles): what the exercise asks the kernel to visit."""
    s, p, longest = batch.seq_lens[0], batch.prefix_lens[0], int(batch.max_item_lens_t[0])
    out = []
    for m_lo in range(0, s, block_m):
        m_hi = min(m_lo + block_m, s)
        prefix_tiles = -(-min(p, m_hi) // block_n)
        resume = max(max(m_lo - longest, 0) // block_n, prefix_tiles)
        out.append(prefix_tiles + max(-(-m_hi // block_n) - resume, 0))
    return out


def _launch_items_lo(jitted, q, k, v, batch: MultiItemBatch, block_m: int, block_n: int, out: Tensor,
                     counts: Tensor, max_item_len: int) -> None:
    """The exercise's kernel on one prompt, writing ``out`` and the key tiles each query tile visited (no host
    sync: a CUDA graph can replay it; ``max_item_len`` is read from the batch once, before)."""
    import math

    _attn_fwd_items_lo[(-(-batch.seq_lens[0] // block_m), q.shape[0])](
        q, k, v, out, batch.token_pos[0], counts, *strides(q, k, v, out), batch.seq_lens[0], batch.prefix_lens[0],
        max_item_len, LOG2E / math.sqrt(q.shape[-1]), ITEMS_LO=jitted, HEAD_DIM=q.shape[-1],
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", SKIP_DELIMITER=ITEM_KEYS_FROM[DEFAULT_RULE],
        BLOCK_M=block_m, BLOCK_N=block_n)


@guarded
def check_items_lo(fn: Callable, tiles: Sequence[tuple[int, int]] = CHECK_TILES) -> bool:
    """``fn(m_lo, prefix_hi, Pos, prefix_len, max_item_len, SKIP_DELIMITER, BLOCK_N) -> items_lo``: written with
    ``tl`` operations, it runs (wrapped in ``triton.jit``) inside a copy of step 4's kernel as the first key of
    the loop over the items. It must give FlashInfer's bound: from ``m_lo - max_item_len`` rounded down to a tile,
    never before ``prefix_hi``. On small prompts in float32 (Triton's interpreter on a CPU) at every tile shape of
    ``tiles``: the output must match the float64 reference within 1e-5 and the key tiles visited must be the
    bound's. Then prints the tiles visited against step 4's exact start, and on a GPU times the kernel against
    step 5."""
    import inspect

    from book.common import gpu_us
    from studylog import runtime
    from studylog.multi_item import steps
    from studylog.multi_item.formats import reference_attention
    from studylog.multi_item.tiles import planned_key_tiles

    try:
        if "raise NotImplementedError" in inspect.getsource(fn):
            raise NotImplementedError
    except (OSError, TypeError):
        pass
    jitted = triton.jit(fn)
    gen = torch.Generator().manual_seed(11)
    device = runtime.device()
    prompts = [(17, [4, 9, 1, 12]), (0, [3, 20, 2, 2, 7]), (5, [1, 1, 30, 1]), (40, [3])]
    cases = len(prompts) * len(tiles)
    bound = exact = 0
    for p, items in prompts:
        batch = MultiItemBatch.from_item_lens([p], [items], device=device)
        q, k, v = (torch.randn(2, batch.total_tokens, 16, generator=gen).to(device) for _ in range(3))
        want = reference_attention(q, k, v, batch)
        for block_m, block_n in tiles:
            where = f"{batch.describe()}, tile {block_m} x {block_n}"
            try:
                out = torch.empty_like(q)
                counts = torch.full((-(-batch.seq_lens[0] // block_m),), -1, dtype=torch.int32, device=device)
                _launch_items_lo(jitted, q, k, v, batch, block_m, block_n, out, counts,
                                 int(batch.max_item_lens_t[0]))
                counts = counts.tolist()
            except Exception as e:  # the interpreter wraps what the reader's function raises
                if "NotImplementedError" in repr(e):
                    raise NotImplementedError from e
                raise
            error = (out.double() - want.double()).abs().max().item()
            if not error < 1e-5:
                return report("check_items_lo", False, f"{where}: max difference {error:.1e} to the float64 "
                              "reference (a tile some row sees was skipped)", cases)
            expected = _bound_tiles(batch, block_m, block_n)
            if counts != expected:
                return report("check_items_lo", False, f"{where}: the query tiles visit {counts} key tiles, the "
                              f"max_item_len bound visits {expected}", cases)
            bound += sum(counts)
            exact += sum(planned_key_tiles(batch, block_m, block_n)[0])
    ok = report("check_items_lo", True, None, cases)
    print(f"key tiles visited over these inputs: {bound} with the max_item_len bound, {exact} with step 4's exact "
          f"start ({bound / exact - 1:+.0%})")
    if runtime.mode() == "gpu":  # one long prompt of short items and a few long ones, in bfloat16
        batch = MultiItemBatch.from_item_lens([1024], [[16] * 60 + [256, 16, 16, 256]], device=device)
        q, k, v = (torch.randn(8, batch.total_tokens, 128, device=device, dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        counts = torch.zeros(-(-batch.seq_lens[0] // 64), dtype=torch.int32, device=device)
        longest = int(batch.max_item_lens_t[0])
        for block_m, block_n in ((64, 64), (128, 64)):
            ours = gpu_us(lambda: _launch_items_lo(jitted, q, k, v, batch, block_m, block_n, out, counts, longest))
            step5 = gpu_us(lambda: steps.step05_batched(q, k, v, batch, blocks=(block_m, block_n)))
            print(f"{batch.describe()}, tile {block_m} x {block_n}: {ours:,.1f} µs with the bound, {step5:,.1f} µs "
                  "at step 5")
    else:
        print("timing skipped: no GPU here (Triton's interpreter checks what a kernel computes, not how fast)")
    return ok
