"""The model body's fused kernels: what a decode step launches per layer on a GPU.

A layer of several tokens runs nine launches: cuBLAS's four products, :func:`add_rms_norm` twice, :func:`rope_cache`,
:func:`attention` and :func:`silu_mul`; a step of one token six: :func:`gemv` four times (RMSNorm or SwiGLU in front,
the residual add behind), :func:`rope_cache` and :func:`attention`. Each kernel rounds where torch's eager
composition rounds, so the two paths differ only in the order of sums. Every wrapper is graph-safe (no host
synchronisation), and ``T`` is not specialised on, so the graphs of all chunk lengths share the compiled kernels."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from studylog import runtime


@triton.jit(do_not_specialize=["T"])
def add_rms_norm_kernel(x_ptr, a_ptr, w_ptr, h_ptr, last_ptr, T, D, eps, stride_last,
                        HAS_ADD: tl.constexpr, GATHER: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program ``r``: row ``r`` of ``x [N, D]`` (with ``GATHER``: row ``r * T + last[r]``). With ``HAS_ADD``,
    ``x += a`` (rounded to x's type, written back unless gathering); then ``h = w * rms_norm(x)`` as Llama
    computes it: normalised in fp32, rounded to x's type, then scaled."""
    r = tl.program_id(0)
    row = r
    if GATHER:
        row = r * T + tl.load(last_ptr + r * stride_last)
    offs = tl.arange(0, BLOCK_D)
    inside = offs < D
    x = tl.load(x_ptr + row.to(tl.int64) * D + offs, mask=inside, other=0.0)
    if HAS_ADD:
        a = tl.load(a_ptr + row.to(tl.int64) * D + offs, mask=inside, other=0.0)
        x = (x.to(tl.float32) + a.to(tl.float32)).to(x_ptr.dtype.element_ty)
        if not GATHER:
            tl.store(x_ptr + row.to(tl.int64) * D + offs, x, mask=inside)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    y = (xf * rstd).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=inside, other=0.0)
    h = (w.to(tl.float32) * y.to(tl.float32)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + r.to(tl.int64) * D + offs, h, mask=inside)


@triton.jit(do_not_specialize=["T"])
def rope_cache_kernel(qkv_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, start_ptr, T, S,
                      stride_start, stride_row, stride_cb, stride_ch, stride_cs, stride_cos,
                      H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr,
                      HEADS_POW2: tl.constexpr, HALF_POW2: tl.constexpr):
    """Program ``r``: token ``t = r % T`` of sequence ``b = r // T``, at position ``start[b] + t``. Its q and k
    heads are rotated in place in ``qkv`` (``x * cos + rotate_half(x) * sin``, each product and the sum
    rounded as torch rounds them); its k and v heads are written into the cache ``[B, Hkv, S, HD]``. A
    position outside the cache (``S`` positions, as many as the tables) writes nothing."""
    r = tl.program_id(0)
    b = r // T
    pos = tl.load(start_ptr + b * stride_start) + r % T
    HALF: tl.constexpr = HD // 2
    head = tl.arange(0, HEADS_POW2)[:, None]
    i = tl.arange(0, HALF_POW2)[None, :]
    fits = (pos + i * 0) < S  # the position as a [1, HALF] tile (a scalar mask is not a mask to the interpreter)
    live = (head < H + 2 * HKV) & (i < HALF) & fits
    base = qkv_ptr + r.to(tl.int64) * stride_row + head * HD + i
    x1 = tl.load(base, mask=live, other=0.0)
    x2 = tl.load(base + HALF, mask=live, other=0.0)
    dt = x1.dtype
    c = tl.load(cos_ptr + pos * stride_cos + i, mask=(i < HALF) & fits, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos * stride_cos + i, mask=(i < HALF) & fits, other=0.0).to(tl.float32)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    # first half: x1 * cos + (-x2) * sin; second half: x2 * cos + x1 * sin (cos and sin repeat per half)
    r1 = ((f1 * c).to(dt).to(tl.float32) + (-f2 * s).to(dt).to(tl.float32)).to(dt)
    r2 = ((f2 * c).to(dt).to(tl.float32) + (f1 * s).to(dt).to(tl.float32)).to(dt)
    rotate = head < H + HKV
    o1 = tl.where(rotate, r1, x1)
    o2 = tl.where(rotate, r2, x2)
    tl.store(base, o1, mask=live & (head < H))
    tl.store(base + HALF, o2, mask=live & (head < H))
    kv = head - H - tl.where(head >= H + HKV, HKV, 0)  # the KV head of a k or v head
    dst = b.to(tl.int64) * stride_cb + kv * stride_ch + pos.to(tl.int64) * stride_cs + i
    is_k = (head >= H) & (head < H + HKV)
    is_v = (head >= H + HKV) & (head < H + 2 * HKV)
    tl.store(k_cache_ptr + dst, o1, mask=live & is_k)
    tl.store(k_cache_ptr + dst + HALF, o2, mask=live & is_k)
    tl.store(v_cache_ptr + dst, o1, mask=live & is_v)
    tl.store(v_cache_ptr + dst + HALF, o2, mask=live & is_v)


@triton.jit(do_not_specialize=["T"])
def attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, start_ptr, T, S, qk_scale,
                     stride_start, stride_qb, stride_qt, stride_cb, stride_ch, stride_cs, stride_ob, stride_ot,
                     HKV: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr):
    """Program ``(b * HKV + j, m)``: rows ``m * BLOCK_M ...`` of the ``G * T`` queries of KV head ``j`` (row
    ``t * G + g`` is token ``t``'s query head ``j * G + g``, Llama's grouping). Query row at position ``p``
    attends to cache positions ``0..p``; blocks of ``BLOCK_N`` keys up to the chunk's last position, online
    softmax in fp32 (``exp2``, ``qk_scale`` includes ``log2(e)``)."""
    pid = tl.program_id(0)
    b = pid // HKV
    j = pid % HKV
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    t = rows // G
    live = t < T
    start = tl.load(start_ptr + b * stride_start)
    pos = start + t
    d = tl.arange(0, BLOCK_D)
    in_d = d < HD
    q_head = j * G + rows % G
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + t[:, None] * stride_qt + q_head[:, None] * HD + d[None, :],
                mask=live[:, None] & in_d[None, :], other=0.0)
    # keys up to the last live row's position (the cache holds S positions)
    t_last = tl.minimum((tl.program_id(1) * BLOCK_M + BLOCK_M - 1) // G, T - 1)
    hi = tl.minimum(start + t_last + 1, S)
    kv_base = b.to(tl.int64) * stride_cb + j * stride_ch
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for n0 in range(0, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        kv_mask = (n < hi)[:, None] & in_d[None, :]
        k = tl.load(k_ptr + kv_base + n[:, None].to(tl.int64) * stride_cs + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q.to(DOT), tl.trans(k.to(DOT))) * qk_scale
        s = tl.where(n[None, :] <= pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: key 0 is visible to every row
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_base + n[:, None].to(tl.int64) * stride_cs + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype).to(DOT), v.to(DOT))
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + t[:, None] * stride_ot + q_head[:, None] * HD + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=live[:, None] & in_d[None, :])


@triton.jit
def silu_mul_kernel(gu_ptr, out_ptr, I, BLOCK: tl.constexpr):
    """Program ``(r, c)``: columns ``c * BLOCK ...`` of row ``r``: ``silu(gate) * up`` with ``gate, up`` the two
    halves of ``gu [N, 2I]``, each op rounded to the input's type as torch rounds ``F.silu(gate) * up``."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < I
    g = tl.load(gu_ptr + r * 2 * I + cols, mask=inside, other=0.0)
    u = tl.load(gu_ptr + r * 2 * I + I + cols, mask=inside, other=0.0)
    gf = g.to(tl.float32)
    silu = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    tl.store(out_ptr + r * I + cols, (silu.to(tl.float32) * u.to(tl.float32)).to(out_ptr.dtype.element_ty),
             mask=inside)


@triton.jit(do_not_specialize=["n"])
def allowed_argmax_kernel(logits_ptr, ids_ptr, steer_ptr, tok_ptr, n, stride_row, stride_steer, steer_bias,
                          BLOCK: tl.constexpr):
    """Program ``b``: the greedy token of sequence ``b`` among the ``n`` sorted ids ``ids``: the argmax of
    ``logits[b, ids]``, with ``steer_bias`` added (in fp32, as ``scatter_add_`` adds it) to the logit of id
    ``steer[b]`` when that id is among them (a negative ``steer`` names none). Ties go to the smallest id, as
    ``torch.argmax`` over the whole row gives them; the ids outside ``ids`` hold ``-inf`` (the masked head's
    contract), so over a row with a finite logit the two agree. A row whose logits at ``ids`` are all ``-inf``
    (a finished sequence of a batch) gets ``ids[0]``."""
    b = tl.program_id(0)
    steer = tl.load(steer_ptr + b * stride_steer)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_id = tl.full((BLOCK,), 2147483647, tl.int32)
    row = logits_ptr + b.to(tl.int64) * stride_row
    for i0 in range(0, n, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        live = i < n
        ids = tl.load(ids_ptr + i, mask=live, other=0)
        v = tl.load(row + ids, mask=live, other=float("-inf"))
        v = tl.where(ids == steer, v + steer_bias, v)
        # a lane sees its ids in increasing order: a later id wins only with a larger logit
        better = live & ((v > best) | ((v == best) & (ids < best_id)))
        best = tl.where(better, v, best)
        best_id = tl.where(better, ids, best_id)
    top = tl.max(best, axis=0)
    tok = tl.min(tl.where(best == top, best_id, 2147483647), axis=0)
    tl.store(tok_ptr + b, tok.to(tl.int64))


@triton.jit
def gemv_kernel(x_ptr, w_ptr, out_ptr, nw_ptr, N, K, eps, NORM: tl.constexpr, SWIGLU: tl.constexpr,
                ADD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_POW2: tl.constexpr):
    """Program ``(p, m)``: entries ``p * BLOCK_N ...`` of ``out[m] = W @ a[m]`` for token ``m`` (a decode step has one;
    a verifier of drafted tokens a few, chapter 8), ``W [N, K]`` streamed once in
    ``[BLOCK_N, BLOCK_K]`` tiles (products and sums on the CUDA cores in fp32: with one row, a tensor core would
    idle fifteen sixteenths of its tile). ``a`` is ``x [K]`` as it is, or with a prologue computed on the fly from
    ``x`` (each program recomputes it: a few kilobytes, from L2, against the program's share of the weight):

    * ``NORM``: ``a = nw * rms_norm(x)``, rounded as :func:`add_rms_norm_kernel` rounds it;
    * ``SWIGLU``: ``x`` is ``[2K]`` (gate, then up) and ``a = silu(gate) * up``, rounded as
      :func:`silu_mul_kernel` rounds it.

    ``ADD``: the product, rounded to ``out``'s type, is added to ``out`` (the residual stream) in place, the sum
    rounded as a residual add rounds it. Each program owns its entries, so the in-place add has no race. Every
    token's program computes exactly what a one-token launch computes (the weight's tiles, re-read from L2 for
    the others), so a token's result does not depend on how many tokens share the launch."""
    pid = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    x_ptr += m * (2 * K if SWIGLU else K)
    out_ptr += m * N
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = n < N
    dt = out_ptr.dtype.element_ty
    if NORM:
        kk = tl.arange(0, K_POW2)
        xv = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=0) / K + eps)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        in_k = k < K
        a = tl.load(x_ptr + k, mask=in_k, other=0.0)
        if SWIGLU:
            up = tl.load(x_ptr + K + k, mask=in_k, other=0.0)
            gf = a.to(tl.float32)
            silu = (gf / (1.0 + tl.exp(-gf))).to(dt)
            a = (silu.to(tl.float32) * up.to(tl.float32)).to(dt)
        if NORM:
            y = (a.to(tl.float32) * rstd).to(dt)
            nw = tl.load(nw_ptr + k, mask=in_k, other=0.0)
            a = (nw.to(tl.float32) * y.to(tl.float32)).to(dt)
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + k[None, :], mask=in_n[:, None] & in_k[None, :], other=0.0)
        acc += w.to(tl.float32) * a.to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1).to(dt)
    if ADD:
        r = tl.load(out_ptr + n, mask=in_n, other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(dt)
    tl.store(out_ptr + n, y, mask=in_n)


def _dot_type(x: Tensor):
    """``tl.dot``'s operand type: the tensor's 16-bit type on a GPU; fp32 for fp32 tensors and in Triton's
    interpreter (whose dot multiplies 16-bit floats as raw integers)."""
    if runtime.mode() == "interpreter" or x.dtype == torch.float32:
        return tl.float32
    return tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16


def add_rms_norm(x: Tensor, weight: Tensor, eps: float, *, add: Tensor | None = None,
                 last: Tensor | None = None) -> Tensor:
    """``weight * rms_norm(x (+ add))`` row by row (``x += add`` in place); with ``last [B]``, only row ``last[b]``
    of each sequence, ``x`` left as it is."""
    D, gather = x.shape[-1], last is not None
    out = x.new_empty(last.shape[0], D) if gather else torch.empty_like(x)  # a program per row of out
    T = x.numel() // D // last.shape[0] if gather else 1
    block = triton.next_power_of_2(D)
    add_rms_norm_kernel[(out.numel() // D,)](
        x, add if add is not None else x, weight, out, last if gather else x, T, D, eps,
        last.stride(0) if gather else 0, HAS_ADD=add is not None, GATHER=gather, BLOCK_D=block,
        num_warps=max(1, min(16, block // 256)))
    return out


def rope_cache(qkv: Tensor, k_cache: Tensor, v_cache: Tensor, cos: Tensor, sin: Tensor, start: Tensor,
               heads: int, kv_heads: int) -> None:
    """Rotate q and k of ``qkv [B, T, (H + 2 Hkv) * hd]`` in place at positions ``start[b] + t`` and write k and v
    into the caches ``[B, Hkv, S, hd]``."""
    B, T = qkv.shape[0], qkv.shape[1]
    hd = k_cache.shape[-1]
    rope_cache_kernel[(B * T,)](
        qkv, k_cache, v_cache, cos, sin, start, T, min(k_cache.shape[2], cos.shape[0]), start.stride(0), qkv.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0), H=heads, HKV=kv_heads, HD=hd,
        HEADS_POW2=triton.next_power_of_2(heads + 2 * kv_heads), HALF_POW2=triton.next_power_of_2(hd // 2), num_warps=4)


def attention(qkv: Tensor, k_cache: Tensor, v_cache: Tensor, start: Tensor, heads: int, scale: float,
              out: Tensor | None = None) -> Tensor:
    """Causal grouped-query attention of the q heads of ``qkv`` over the cache: ``[B, T, H * hd]``."""
    B, T = qkv.shape[0], qkv.shape[1]
    _, Hkv, S, hd = k_cache.shape
    G = heads // Hkv
    out = qkv.new_empty(B, T, heads * hd) if out is None else out
    block_m = max(16, min(64, triton.next_power_of_2(G * T)))
    grid = (B * Hkv, triton.cdiv(G * T, block_m))
    attention_kernel[grid](
        qkv, k_cache, v_cache, out, start, T, S, scale * math.log2(math.e), start.stride(0),
        qkv.stride(0), qkv.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), HKV=Hkv, G=G, HD=hd, BLOCK_D=max(16, triton.next_power_of_2(hd)),
        BLOCK_M=block_m, BLOCK_N=64, DOT=_dot_type(k_cache), num_warps=4, num_stages=2)
    return out


def silu_mul(gate_up: Tensor) -> Tensor:
    """``silu(gate) * up`` of ``gate_up [..., 2I]`` (gate first), ``[..., I]``."""
    I = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * I)
    out = gate_up.new_empty(*gate_up.shape[:-1], I)
    block = min(1024, triton.next_power_of_2(I))
    silu_mul_kernel[(rows, triton.cdiv(I, block))](gate_up, out, I, BLOCK=block, num_warps=4)
    return out


def gemv_tiles(N: int, K: int) -> dict[str, int]:
    """The tile of :func:`gemv` for a ``[N, K]`` weight: two rows per program, reads of up to a thousand values (the
    best of a timed grid, ``lab/decode/gemv_tiles.py``)."""
    return dict(BLOCK_N=2, BLOCK_K=min(1024, max(16, triton.next_power_of_2(K))), num_warps=4, num_stages=2)


def gemv(x: Tensor, weight: Tensor, *, norm: Tensor | None = None, eps: float = 0.0, swiglu: bool = False,
         add_to: Tensor | None = None) -> Tensor:
    """``prologue(x) @ weight.T`` for a few tokens in one launch: ``norm`` puts RMSNorm in front, ``swiglu`` takes
    ``x [..., 2K]`` and puts ``silu(gate) * up`` in front; ``add_to`` gets the product added in place."""
    N, K = weight.shape
    width = 2 * K if swiglu else K
    if x.shape[-1] != width or x.numel() == 0:
        raise ValueError(f"gemv takes rows of {width} values for a weight of shape {tuple(weight.shape)}"
                         f"{' with swiglu' if swiglu else ''}; got x of shape {tuple(x.shape)}")
    rows = x.numel() // width
    if add_to is not None and (add_to.numel() != rows * N or not add_to.is_contiguous()):
        raise ValueError(f"add_to must be {rows} contiguous rows of {N} values, got shape {tuple(add_to.shape)}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")
    out = add_to if add_to is not None else x.new_empty(*x.shape[:-1], N)
    tiles = gemv_tiles(N, K)
    gemv_kernel[(triton.cdiv(N, tiles["BLOCK_N"]), rows)](
        x, weight, out, norm if norm is not None else weight, N, K, eps, NORM=norm is not None, SWIGLU=swiglu,
        ADD=add_to is not None, K_POW2=triton.next_power_of_2(K), **tiles)
    return out


#: The most ids :func:`allowed_argmax` takes: one program per sequence walks them, which beats an argmax over the
#: whole vocabulary only while they are a small part of it (a string's content allows most of the vocabulary).
ALLOWED_ARGMAX_MAX = 8192


def allowed_argmax(logits: Tensor, ids: Tensor, n: int, steer: Tensor, steer_bias: float, out: Tensor) -> Tensor:
    """Greedy tokens ``out [B]`` from ``logits [B, V]`` (fp32, ``-inf`` outside the allowed ids) read only at the
    first ``n`` sorted ``ids``; ``n`` is a host integer, so nothing synchronises."""
    if not 1 <= n <= min(ids.numel(), ALLOWED_ARGMAX_MAX):
        raise ValueError(f"n must be in [1, min(ids.numel()={ids.numel()}, {ALLOWED_ARGMAX_MAX})], got {n}")
    if logits.dtype != torch.float32 or ids.dtype != torch.int32 or out.dtype != torch.int64:
        raise ValueError(f"logits must be float32, ids int32 and out int64; got {logits.dtype}, {ids.dtype}, "
                         f"{out.dtype}")
    B = logits.shape[0]
    if logits.stride(1) != 1 or steer.shape[0] != B or out.shape[0] != B:
        raise ValueError(f"logits must be [B, V] with contiguous rows and steer, out [B]; got {tuple(logits.shape)}, "
                         f"{tuple(steer.shape)}, {tuple(out.shape)}")
    # two block sizes, so that a decode loop compiles two variants in all (``n`` itself is not specialised on)
    allowed_argmax_kernel[(B,)](logits, ids, steer, out, n, logits.stride(0), steer.stride(0), steer_bias,
                                BLOCK=128 if n <= 128 else 1024, num_warps=4)
    return out

