// Step 12 of chapter 3 (the library's ngram_stream.cu), with two compile-time knobs that take back
// two changes it inherits, so that step 12 can be timed without them:
//
//   stream_changes<LOADS, VEC, SKIP_LAZY, CACHE_EVICT_FIRST, EXIT, FUSED> <<<(batch, chunks), 256>>>
//     EXIT:  each thread reads the slot's global key with every tile and stops once no later window
//            can beat it (step 9's loop: one load a tile and no barrier; added to step 5 the exit
//            costs two barriers a tile). false: a block scans its whole chunk (a block whose chunk
//            cannot beat the key when it starts still skips it: that check is step 6's split).
//     FUSED: the last block to finish runs phase 2 (a ticket after a fence: step 8). false: phase 2
//            is budget_scan_reset <<<1, 1024>>>, a second launch, keys reset as in step 6.
//
// At EXIT = FUSED = true the kernel compiles to the library's ngram_stream<LOADS, VEC, true, true>
// (the lab script checks the PTX, names aside): the knobs change nothing else.
#include "ngram_common.cuh"

// How the scan loads haystack tokens (the CACHE template parameter).
#define CACHE_EVICT_FIRST 2  // ld.global.nc with an L2 evict-first cache policy (createpolicy)

// An L2 policy that marks every line it loads as the first to evict.
__device__ __forceinline__ u64 evict_first_policy() {
    u64 policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// VEC consecutive tokens from hay[e ..] (16-byte aligned when VEC == 2). Lines loaded evict-first
// replace each other in L2 rather than lines other work still needs (or must write back first).
template <int VEC>
__device__ __forceinline__ void load_tokens(const i64 *__restrict__ hay, i64 e, i64 *out) {
    const u64 policy = evict_first_policy();
    if constexpr (VEC == 2)
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.s64 {%0, %1}, [%2], %3;"
                     : "=l"(out[0]), "=l"(out[1]) : "l"(hay + e), "l"(policy));
    else
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.s64 %0, [%1], %2;"
                     : "=l"(out[0]) : "l"(hay + e), "l"(policy));
}

// One tile of this thread's tokens: LOADS loads of VEC tokens, those starting after `last` skipped.
template <int LOADS, int VEC>
__device__ __forceinline__ void load_tile(const i64 *__restrict__ hay, i64 tile, i64 last, i64 *token) {
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
        const i64 e = tile + ((i64)u * blockDim.x + threadIdx.x) * VEC;
        if (e <= last) load_tokens<VEC>(hay, e, token + u * VEC);
    }
}

// How slots the budget refuses skip their search (the BUDGET_SKIP template parameter).
#define SKIP_LAZY 2   // the warps search at once; the last warp to add its part of the bound raises a
                      // flag if the slot is refused, and every warp stops at the end of its tile

// Slot b (active) gets no drafts whatever the searches find when the bound below reaches
// threshold - 1. The reference refuses it when sum + left >= threshold - 1, with sum the tokens of
// slots 0..b. Searches only add drafts, so sum is at least the sum of the slots' bases; if even
// that leaves no room, the slot is refused. The sum over all slots s of
// counted[s] + (s <= b ? base[s] - active[s] : 0) is that smallest sum plus `left`; every term is
// >= 0. This returns the warp's part (the threads' slots are s = threadIdx.x + k * blockDim.x).
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

// SKIP_LAZY: one 64-bit shared word holds the sum of the warps' parts (low 40 bits; each part is
// clamped below 2^32, which keeps every decision since threshold < 2^31) and, above them, how many
// warps have added theirs. The warp that completes the count decides; no barrier.
#define LAZY_COUNT_SHIFT 40
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

template <int LOADS, int VEC, int BUDGET_SKIP, int CACHE, bool EXIT, bool FUSED>
__global__ void __launch_bounds__(256) stream_changes(NGRAM_KERNEL_PARAMS) {
    static_assert(BUDGET_SKIP == SKIP_LAZY && CACHE == CACHE_EVICT_FIRST, "step 12's values only");
    const int b = blockIdx.x;
    const int chunk = blockIdx.y;
    const int src = chunk >= prompt_chunks;  // 0: a prompt chunk, 1: a chunk of generated tokens
    __shared__ int s_last;
    __shared__ unsigned long long s_lazy;
    __shared__ int s_refused;
    if (threadIdx.x == 0) s_lazy = 0, s_refused = 0;
    __syncthreads();
    if (b < batch) {  // uniform over the block, as is everything `search` depends on
        const SlotPlan p = plan_slot(b, SLOT_ARGS);
        const int step = step_idx[b];
        const int top = min(max_ngram, step);
        const i64 *gen = generated_ids + (i64)b * gen_width;
        const i64 *hay = src ? gen : prompt_ids + (i64)b * prompt_width;
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
            load_tile<LOADS, VEC>(hay, tile, last_end, token);
            // the bound's loads (L2 hits) overlap the first tile's
            add_bound_part(b, &s_lazy, &s_refused, NGRAM_KERNEL_ARGS);
            for (;;) {
                if constexpr (EXIT) seen = load_shared_key(match_keys + b);  // in flight with the tile's loads
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
                if (tile > last_end) break;
                if (EXIT && seen <= tile_floor_key(top, src, tile)) break;
                if (*(volatile int *)&s_refused) break;
                load_tile<LOADS, VEC>(hay, tile, last_end, token);
            }
            if (mine != NONE_KEY) __threadfence();  // published before this block counts itself done
        }
    }
    // The last block to finish runs phase 2, as in step 8. Unfused: phase 2 is budget_scan_reset, launched after.
    if constexpr (FUSED) last_block_budget(s_last, NGRAM_KERNEL_ARGS);
}

// Phase 2 as a launch of its own: what the fused kernel's last block runs, keys reset for the next call.
extern "C" __global__ void budget_scan_reset(NGRAM_KERNEL_PARAMS) {
    budget_scan_block(NGRAM_KERNEL_ARGS, /*reset_keys=*/1);
}
