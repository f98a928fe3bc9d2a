// Steps 9 to 12: step 8's fused one-pass search as a streaming read (ngram_stream <<<(batch, chunks), 256>>>).
// One template, ngram_stream<LOADS, VEC, EVICT_FIRST, SKIP_REFUSED>; each step turns one more knob on:
//   step 9, <4, 1, false, false>: no barrier in the loop. In step 8 every tile ends with two __syncthreads
//     (a shared best key, then a shared stop flag), so each warp waits for the block's slowest load and the
//     memory pipe drains once per tile. Here each thread publishes its own candidate (a global atomicMin,
//     rare: only where the newest token matches) and reads the slot's key with each tile to know when to
//     stop. LOADS loads of one token per thread per tile; the one token compared with is in a register.
//   step 10, <4, VEC, false, false>: VEC = 2 tokens a load (16 bytes) where every row is 16-byte aligned.
//   step 11, <4, VEC, true, false>: haystack lines are loaded evict-first (load_tokens).
//   step 12, <4, VEC, true, true>: a slot the batch budget refuses whatever the searches find is not
//     searched (the serial loop never searched it either). The bound needs only per-slot facts.
#include "ngram_common.cuh"

// An L2 policy that marks every line it loads as the first to evict.
__device__ __forceinline__ u64 evict_first_policy() {
    u64 policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// VEC consecutive tokens from hay[e ..] (16-byte aligned when VEC == 2). Lines loaded evict-first
// replace each other in L2 rather than lines other work still needs (or must write back first).
template <int VEC, bool EVICT_FIRST>
__device__ __forceinline__ void load_tokens(const i64 *__restrict__ hay, i64 e, i64 *out) {
    if constexpr (EVICT_FIRST) {
        const u64 policy = evict_first_policy();
        if constexpr (VEC == 2) {
            asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.s64 {%0, %1}, [%2], %3;"
                         : "=l"(out[0]), "=l"(out[1]) : "l"(hay + e), "l"(policy));
        } else {
            asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.s64 %0, [%1], %2;"
                         : "=l"(out[0]) : "l"(hay + e), "l"(policy));
        }
    } else {
        if constexpr (VEC == 2) {
            const longlong2 v = __ldg(reinterpret_cast<const longlong2 *>(hay + e));
            out[0] = v.x, out[1] = v.y;
        } else {
            out[0] = __ldg(hay + e);
        }
    }
}

// One tile of this thread's tokens: LOADS loads of VEC tokens, those starting after `last` skipped.
template <int LOADS, int VEC, bool EVICT_FIRST>
__device__ __forceinline__ void load_tile(const i64 *__restrict__ hay, i64 tile, i64 last, i64 *token) {
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
        const i64 e = tile + ((i64)u * blockDim.x + threadIdx.x) * VEC;
        if (e <= last) load_tokens<VEC, EVICT_FIRST>(hay, e, token + u * VEC);
    }
}

// Slot b (active) gets no drafts whatever the searches find when the bound below reaches threshold - 1. The reference
// refuses it when sum + left >= threshold - 1, with sum the tokens of slots 0..b. Searches only add drafts, so sum is
// at least the sum of the slots' bases; if even that leaves no room, the slot is refused. The sum over all slots s of
// counted[s] + (s <= b ? base[s] - active[s] : 0) is that smallest sum plus `left`; every term is >= 0. This returns
// the warp's part (the threads' slots are s = threadIdx.x + k * blockDim.x).
__device__ __forceinline__ i64 budget_bound_part(int b, NGRAM_KERNEL_PARAMS) {
    i64 v = 0;
    for (int s = threadIdx.x; s < batch; s += blockDim.x) {
        const SlotPlan q = plan_slot(s, SLOT_ARGS);
        v += q.counted;
        if (s <= b) v += q.base - (q.kind == SLOT_ACTIVE);
    }
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);  // every lane: the warp's sum
    return v;
}

#define LAZY_COUNT_SHIFT 40
// The warps search at once; the last warp to add its part of the bound raises a flag if the slot is refused, and
// every warp stops at the end of its tile. One 64-bit shared word holds the sum of the warps' parts (low
// LAZY_COUNT_SHIFT = 40 bits; each part is clamped below 2^32, which keeps every decision since threshold < 2^31)
// and, above them, how many warps have added theirs. The warp that completes the count decides; no barrier.
__device__ __forceinline__ void add_bound_part(int b, unsigned long long *s_lazy, volatile int *s_refused,
                                               NGRAM_KERNEL_PARAMS) {
    const i64 part = min64(budget_bound_part(b, NGRAM_KERNEL_ARGS), 0xffffffffll);
    if ((threadIdx.x & 31) == 0) {
        const unsigned long long old = atomicAdd(s_lazy, (1ull << LAZY_COUNT_SHIFT) + (unsigned long long)part);
        if ((old >> LAZY_COUNT_SHIFT) == blockDim.x / 32 - 1) {
            const i64 bound = (i64)((old + part) & ((1ull << LAZY_COUNT_SHIFT) - 1));
            if (bound >= (i64)threshold - 1) *s_refused = 1;
        }
    }
}

template <int LOADS, int VEC, bool EVICT_FIRST, bool SKIP_REFUSED>
__global__ void __launch_bounds__(256) ngram_stream(NGRAM_KERNEL_PARAMS) {
    const int b = blockIdx.x;
    const int chunk = blockIdx.y;
    const int src = chunk >= prompt_chunks;  // 0: a prompt chunk, 1: a chunk of generated tokens
    __shared__ int s_last;
    __shared__ unsigned long long s_lazy; __shared__ int s_refused;  // SKIP_REFUSED: the bound so far; refused?
    if constexpr (SKIP_REFUSED) {
        if (threadIdx.x == 0) s_lazy = 0, s_refused = 0;
        __syncthreads();
    }
    if (b < batch) {  // uniform over the block, as is everything `search` depends on
        SLOT_OF_BLOCK;  // p, step, top, gen, hay
        const i64 first_end = (i64)(src ? chunk - prompt_chunks : chunk) * chunk_len;
        const i64 hay_last_end = (src ? (i64)step : (i64)prompt_lens[b]) - 2;  // keeps a token after
        const i64 last_end = min64(first_end + chunk_len - 1, hay_last_end);
        const bool search = p.kind == SLOT_ACTIVE && p.cap >= 1 && top >= min_ngram && first_end <= last_end;
        // what the slot's other blocks found so far (one load per warp, the same value in every lane)
        u64 seen = search ? __shfl_sync(0xffffffffu, load_shared_key(match_keys + b), 0) : NONE_KEY;
        if (search && seen > tile_floor_key(top, src, first_end)) {
            const i64 newest = gen[step];
            const i64 tile_len = (i64)blockDim.x * LOADS * VEC;
            u64 mine = NONE_KEY;  // the best this thread found
            i64 tile = first_end;
            i64 token[LOADS * VEC];
            load_tile<LOADS, VEC, EVICT_FIRST>(hay, tile, last_end, token);
            if constexpr (SKIP_REFUSED) {
                // the bound's loads (L2 hits) overlap the first tile's
                add_bound_part(b, &s_lazy, &s_refused, NGRAM_KERNEL_ARGS);
            }
            for (;;) {
                seen = load_shared_key(match_keys + b);  // in flight with the tile's loads
                u64 best = NONE_KEY;
#pragma unroll
                for (int u = 0; u < LOADS; ++u) {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) {
                        const i64 e = tile + ((i64)u * blockDim.x + threadIdx.x) * VEC + k;
                        if (e <= last_end && token[u * VEC + k] == newest) {
                            int len = 1;  // common suffix of hay[.. e] and the generated tokens, up to top
                            while (len < top && len <= e && __ldg(hay + e - len) == __ldg(gen + step - len)) ++len;
                            if (len >= min_ngram) {
                                const u64 key = make_key(len, src, e - len + 1);
                                best = key < best ? key : best;
                            }
                        }
                    }
                }
                if (best < mine && best < seen) {
                    atomicMin(match_keys + b, best);  // lets every other thread of the slot stop early
                    mine = best;
                }
                seen = mine < seen ? mine : seen;
                tile += tile_len;
                if (tile > last_end || seen <= tile_floor_key(top, src, tile)) break;
                if constexpr (SKIP_REFUSED) {
                    if (*(volatile int *)&s_refused) break;
                }
                load_tile<LOADS, VEC, EVICT_FIRST>(hay, tile, last_end, token);
            }
            if (mine != NONE_KEY) __threadfence();  // published before this block counts itself done
        }
    }
    // The last block to finish runs phase 2, as in step 8.
    last_block_budget(s_last, NGRAM_KERNEL_ARGS);
}
