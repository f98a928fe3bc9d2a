// Step 8 of chapter 3 (the library's ngram_one_pass_fused, ngram_one_pass.cu), frozen, with a knob that
// drops its barriers, so that step 9's two ideas can be timed one at a time:
//
//   fused_parts<BARRIERS> <<<(batch, chunks), 256>>>
//     BARRIERS = true:  step 8. Every tile ends with two __syncthreads (the block's best key in shared
//                       memory, then a shared stop flag that thread 0 sets from the slot's global key).
//     BARRIERS = false: 9a, no barrier in the loop. Each thread keeps its own best key, publishes it with
//                       a global atomicMin when it improves, and reads the slot's key with each tile to
//                       stop on its own; the pattern is read from the generated tokens (a shared copy would
//                       need a barrier), the newest token once, in a register.
//   The other idea of step 9, its streaming layout (ngram_stream.cu: fewer, longer chunks, about four blocks
//   an SM and at least two tiles each, the loads of a tile issued apart from its compares), is a launch of
//   the library's step 9; 9a at step 9's split (its arguments) sits between the two.
//
// At BARRIERS = true the kernel compiles to the library's ngram_one_pass_fused (the lab script checks the
// PTX, names aside): the knob changes nothing else.
#include "ngram_common.cuh"

#define ITEMS 4  // end positions per thread per tile: independent loads in flight

// The pattern's token k, generated[step - k]: from the block's shared copy (BARRIERS), or else from
// global memory (`pattern` points at generated[step]).
template <bool BARRIERS>
__device__ __forceinline__ i64 pattern_token(const i64 *pattern, int k) {
    if constexpr (BARRIERS) return pattern[k];
    else return __ldg(pattern - k);
}

// Best key among this thread's ends in the tile (tile + j * blockDim.x + threadIdx.x, j < ITEMS),
// ends beyond last_end excluded.
template <bool BARRIERS>
__device__ __forceinline__ u64 scan_tile(const i64 *__restrict__ hay, i64 tile, i64 last_end,
                                         const i64 *pattern, i64 newest, int top, int min_ngram, int src) {
    i64 token[ITEMS];
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        const i64 e = tile + (i64)j * blockDim.x + threadIdx.x;
        token[j] = e <= last_end ? __ldg(hay + e) : 0;
    }
    u64 best = NONE_KEY;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        const i64 e = tile + (i64)j * blockDim.x + threadIdx.x;
        if (e <= last_end && token[j] == (BARRIERS ? pattern[0] : newest)) {
            int len = 1;  // common suffix of hay[.. e] and the generated tokens, up to top
            while (len < top && len <= e && __ldg(hay + e - len) == pattern_token<BARRIERS>(pattern, len)) ++len;
            if (len >= min_ngram) {
                const u64 key = make_key(len, src, e - len + 1);
                best = key < best ? key : best;
            }
        }
    }
    return best;
}

template <bool BARRIERS>
__device__ __forceinline__ void search_chunk(NGRAM_KERNEL_PARAMS) {
    const int b = blockIdx.x;
    const int chunk = blockIdx.y;
    const int src = chunk >= prompt_chunks;  // 0: a prompt chunk, 1: a chunk of generated tokens
    __shared__ i64 s_pattern[NGRAM_MAX];
    __shared__ u64 s_best;
    __shared__ int s_stop;
    if (b < batch) {  // uniform over the block
        SLOT_OF_BLOCK;  // p, step, top, gen, hay
        const i64 first_end = (i64)(src ? chunk - prompt_chunks : chunk) * chunk_len;
        const i64 hay_last_end = (src ? (i64)step : (i64)prompt_lens[b]) - 2;  // keeps a token after
        const i64 last_end = min64(first_end + chunk_len - 1, hay_last_end);
        if (p.kind == SLOT_ACTIVE && p.cap >= 1 && top >= min_ngram && first_end <= last_end) {
            if constexpr (BARRIERS) {
                u64 seen = NONE_KEY;
                if (threadIdx.x == 0) seen = load_shared_key(match_keys + b);
                if ((int)threadIdx.x < top) s_pattern[threadIdx.x] = gen[step - (int)threadIdx.x];
                if (threadIdx.x == 0) {
                    s_best = NONE_KEY;
                    s_stop = seen <= tile_floor_key(top, src, first_end);
                }
                __syncthreads();
                u64 published = NONE_KEY;  // thread 0: the best key this block has made global
                const i64 tile_len = (i64)blockDim.x * ITEMS;
                for (i64 tile = first_end;; tile += tile_len) {
                    if (s_stop) break;  // thread 0 rewrites s_stop only after the next barrier
                    if (threadIdx.x == 0) seen = load_shared_key(match_keys + b);  // in flight with the tile's loads
                    const u64 mine = scan_tile<true>(hay, tile, last_end, s_pattern, 0, top, min_ngram, src);
                    if (mine != NONE_KEY) atomicMin(&s_best, mine);
                    __syncthreads();  // s_best is final for this tile, and everyone has read s_stop
                    if (threadIdx.x == 0) {
                        if (s_best < published) {
                            atomicMin(match_keys + b, s_best);  // lets the slot's other blocks stop early
                            published = s_best;
                        }
                        const i64 next = tile + tile_len;
                        const u64 floor_key = tile_floor_key(top, src, next);
                        s_stop = next > last_end || s_best <= floor_key || seen <= floor_key;
                    }
                    __syncthreads();
                }
            } else {
                // what the slot's other blocks found so far (one load per warp, the same value in every lane)
                u64 seen = __shfl_sync(0xffffffffu, load_shared_key(match_keys + b), 0);
                const i64 newest = gen[step];
                const i64 tile_len = (i64)blockDim.x * ITEMS;
                u64 mine = NONE_KEY;  // the best this thread found
                for (i64 tile = first_end; seen > tile_floor_key(top, src, tile); tile += tile_len) {
                    seen = load_shared_key(match_keys + b);  // in flight with the tile's loads
                    const u64 best = scan_tile<false>(hay, tile, last_end, gen + step, newest, top, min_ngram, src);
                    if (best < mine && best < seen) {
                        atomicMin(match_keys + b, best);  // lets every other thread of the slot stop early
                        mine = best;
                    }
                    seen = mine < seen ? mine : seen;
                    if (tile + tile_len > last_end) break;
                }
                if (mine != NONE_KEY) __threadfence();  // published before this block counts itself done
            }
        }
    }
}

template <bool BARRIERS>
__global__ void fused_parts(NGRAM_KERNEL_PARAMS) {
    search_chunk<BARRIERS>(NGRAM_KERNEL_ARGS);
    __shared__ int s_last;
    // The last block to finish runs phase 2 (all keys are final once every block has counted).
    last_block_budget(s_last, NGRAM_KERNEL_ARGS);
}
