"""The answers to chapter 7's exercises. The notebook does not import this module (only the checks in
:mod:`book.decode.exercises` do): read it after trying."""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["step_speedup", "pack_bitmask", "unpack_bitmask", "jump_decode", "chunked_forward", "gemv_tile",
           "gemv_tile_measured"]


def step_speedup(parts: Mapping[str, float], faster: Mapping[str, float]) -> float:
    """Exercise 1's answer: a step whose parts take ``parts[name]`` ms becomes ``sum(parts) /
    sum(parts[name] / faster.get(name, 1))`` times faster when part ``name`` gets ``faster[name]`` times faster
    (``math.inf``: the part vanishes). Parts not in ``faster`` keep their time."""
    before = sum(parts.values())
    after = sum(t / faster.get(name, 1.0) for name, t in parts.items())
    return before / after if after > 0 else math.inf


def pack_bitmask(ids: Sequence[int], vocab: int) -> np.ndarray:
    """Exercise 2 (packing): int32 ``[ceil(vocab / 32)]``, token ``v`` is bit ``v % 32`` of word
    ``v // 32``; the bits past ``vocab`` stay 0."""
    bits = np.zeros(-(-vocab // 32) * 32, dtype=np.uint8)
    bits[np.asarray(ids, dtype=np.int64)] = 1
    words = (bits.reshape(-1, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=1)
    return words.astype(np.uint32).view(np.int32)


def unpack_bitmask(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    """Exercise 2 (unpacking): the sorted int64 ids whose bit is set, bits past ``vocab``
    ignored."""
    words = np.asarray(bitmask, dtype=np.int32).reshape(-1).view(np.uint32)
    bits = (words[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    return np.flatnonzero(bits.reshape(-1)[:vocab]).astype(np.int64)


def jump_decode(allowed: Callable[[Sequence[int]], list[int]], model: Callable[[tuple, list], int],
                max_new_tokens: int, eos: int = 0) -> list[int]:
    """Exercise 3: where exactly one token is allowed it is appended without calling the model
    (only EOS allowed: the output ends); a chain of forced tokens stops at ``max_new_tokens``."""
    out: list[int] = []
    while len(out) < max_new_tokens:
        options = allowed(out)
        if options == [eos]:
            break
        tok = options[0] if len(options) == 1 else model(tuple(out), options)
        if tok == eos:
            break
        out.append(tok)
    return out


def chunked_forward(model, tokens: Tensor, chunks: Sequence[int], sizes: Sequence[int]) -> Tensor:
    """Exercise 4: feed ``tokens [B, T]`` to a fresh cache in chunks of ``chunks`` tokens, each
    padded to the smallest length in ``sizes`` that holds it; the chunk starts where the cache ends, and
    ``last`` names its last real token. Padded tokens write keys past the real ones, which the next chunk
    overwrites before any query sees them. Returns the last chunk's hidden states ``[B, D]``."""
    B = tokens.shape[0]
    cache = model.new_cache(B, tokens.shape[1] + max(sizes))
    start, out = 0, None
    for n in chunks:
        T = min(s for s in sizes if s >= n)
        chunk = torch.zeros(B, T, dtype=tokens.dtype)
        chunk[:, :n] = tokens[:, start:start + n]
        out = model(chunk, torch.full((B,), start), torch.full((B,), n - 1), cache)
        start += n
    return out


def gemv_tile(x: Tensor, weight: Tensor, BLOCK_N: int = 4, BLOCK_K: int = 256) -> Tensor:
    """Exercise 5's answer: ``x [M, K] @ weight.T`` by the six-launch layer's kernel
    (:func:`studylog.decode.kernels.gemv_kernel`) with a tile of one's own, ``BLOCK_N`` rows of the weight and
    ``BLOCK_K`` columns a program, one program row per token (no prologue, no residual add)."""
    import triton

    from studylog.decode import kernels

    N, K = weight.shape
    x = x.contiguous()
    out = x.new_empty(x.shape[0], N)
    kernels.gemv_kernel[(triton.cdiv(N, BLOCK_N), x.shape[0])](
        x, weight, out, weight, N, K, 0.0, NORM=False, SWIGLU=False, ADD=False, BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K, K_POW2=triton.next_power_of_2(K), num_warps=4)
    return out


def gemv_tile_measured() -> str | None:
    """Exercise 5's measured answer, in words, from the sweep that chose the library's tile
    (:func:`book.decode.lesson.gemv_tile_answer`, ``lab/decode/gemv_tiles.py``; recorded on an H100, not the H200
    the chapter's page is timed on): per weight of the 1B cost model, the library's two rows a program against the
    best sixteen-row tile with the same columns, and why two rows win. None where the sweep is not committed."""
    from book.decode.lesson import gemv_tile_answer

    answer = gemv_tile_answer()
    if answer is None:
        return None
    o = next(r for r in answer["rows"] if r["weight"] == "o")
    gaps = [r["us16"] - r["us"] for r in answer["rows"]]
    each = "; ".join(f"{r['weight']} ({r['N']:,} x {r['K']:,}) two rows {r['us']:.1f}, sixteen {r['us16']:.1f}"
                     for r in answer["rows"])
    return (f"On {answer['gpu']}, µs a product, {o['columns']} columns a program: {each}. Two rows win on every "
            f"weight, by {min(gaps):.1f} to {max(gaps):.1f} µs, most in proportion on o ({o['us16'] / o['us']:.2f}x): "
            f"its {o['N']:,} rows make {o['programs']:,} programs of two rows but {o['programs16']} of sixteen, fewer "
            "than the card has SMs, so fewer of its bytes are in flight, and a one-token product's time is the time "
            "to stream its weight.")
