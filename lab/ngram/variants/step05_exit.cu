// Step 5 of chapter 3 (the library's ngram_search_one_pass, in ngram_one_pass.cu) with one
// compile-time knob, so that an early exit can be timed against it:
//
//   one_pass_search<EARLY_EXIT> <<<batch, 256>>>, then ngram_budget_scan <<<1, 1024>>> (the library's):
//     false = the library's step 5: one pass for every n, each thread measuring the common suffix at
//             its end positions, over every tile of both haystacks, no barrier in the loop;
//     true  = 5b: the block stops once no later window can beat its best key. Every thread must see
//             that key, which takes two barriers a tile.
//
// At EARLY_EXIT = false the kernel compiles to the library's PTX (the lab script checks it, names
// aside): the knob changes nothing else.
#include "ngram_common.cuh"

#define ITEMS 4  // end positions per thread per tile: independent loads in flight

// Best key among this thread's ends in the tile (tile + j * blockDim.x + threadIdx.x, j < ITEMS),
// ends beyond last_end excluded. s_pattern[k] = generated[step - k], the pattern read backwards.
__device__ __forceinline__ u64 scan_tile(const i64 *__restrict__ hay, i64 tile, i64 last_end,
                                         const i64 *s_pattern, int top, int min_ngram, int src) {
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
        if (e <= last_end && token[j] == s_pattern[0]) {
            int len = 1;  // common suffix of hay[.. e] and the generated tokens, up to top
            while (len < top && len <= e && __ldg(hay + e - len) == s_pattern[len]) ++len;
            if (len >= min_ngram) {
                const u64 key = make_key(len, src, e - len + 1);
                best = key < best ? key : best;
            }
        }
    }
    return best;
}

template <bool EARLY_EXIT>
__global__ void one_pass_search(NGRAM_KERNEL_PARAMS) {
    const int b = blockIdx.x;
    if (b >= batch) return;  // uniform over the block
    __shared__ i64 s_pattern[NGRAM_MAX];
    __shared__ u64 s_best;
    const SlotPlan p = plan_slot(b, SLOT_ARGS);
    const int step = step_idx[b];
    const int top = min(max_ngram, step);
    const i64 *prompt = prompt_ids + (i64)b * prompt_width;
    const i64 *gen = generated_ids + (i64)b * gen_width;
    const bool search = p.kind == SLOT_ACTIVE && p.cap >= 1 && top >= min_ngram;
    if (threadIdx.x == 0) s_best = NONE_KEY;
    if (search && (int)threadIdx.x < top) s_pattern[threadIdx.x] = gen[step - (int)threadIdx.x];
    __syncthreads();
    if (search) {
        const i64 tile_len = (i64)blockDim.x * ITEMS;
        for (int src = 0; src < 2; ++src) {
            const i64 *hay = src ? gen : prompt;
            const i64 last_end = (src ? (i64)step : (i64)prompt_lens[b]) - 2;  // keeps a token after
            if constexpr (EARLY_EXIT) {
                for (i64 tile = 0;; tile += tile_len) {
                    const bool stop = tile > last_end || s_best <= tile_floor_key(top, src, tile);
                    __syncthreads();  // everyone has read s_best before anyone lowers it
                    if (stop) break;
                    const u64 mine = scan_tile(hay, tile, last_end, s_pattern, top, min_ngram, src);
                    if (mine != NONE_KEY) atomicMin(&s_best, mine);
                    __syncthreads();
                }
            } else {
                for (i64 tile = 0; tile <= last_end; tile += tile_len) {
                    const u64 mine = scan_tile(hay, tile, last_end, s_pattern, top, min_ngram, src);
                    if (mine != NONE_KEY) atomicMin(&s_best, mine);
                }
            }
        }
        if constexpr (!EARLY_EXIT) __syncthreads();  // every atomicMin is done before thread 0 reads s_best
    }
    if (threadIdx.x == 0) match_keys[b] = s_best;
}
