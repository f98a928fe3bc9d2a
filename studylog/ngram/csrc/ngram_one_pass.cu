// Steps 5 to 8: one pass over each haystack for every n at once. A window of size n ending at e
// matches the last n generated tokens exactly when hay[.. e] and the generated tokens share a suffix of
// length >= n, so a thread measures that suffix at its end positions (one comparison almost everywhere: the
// newest token rarely matches), and the largest n it allows is that end's candidate. Keys
// (ngram_common.cuh) rank candidates, so one atomicMin keeps the best.
//   step 5, ngram_search_one_pass <<<batch, 256>>>: a block per slot, no barrier in the loop, then
//       ngram_budget_scan. (Stopping once nothing left can beat the best key costs two barriers a tile
//       here, more than the bytes it saves; steps 9 to 12 stop with one load a tile instead.)
//   step 6, ngram_one_pass_split <<<(batch, chunks), 256>>>: a block per chunk of each slot's haystacks,
//       so a few long slots still fill the GPU; phase 2 is a second launch, ngram_budget_scan_reset.
//   step 7, ngram_one_pass_split_early, then ngram_budget_scan_early: step 6 with phase 2 launched early.
//   step 8, ngram_one_pass_fused: step 6's kernel, whose last block to finish runs phase 2: one launch.
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

extern "C" __global__ void ngram_search_one_pass(NGRAM_KERNEL_PARAMS) {
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
            for (i64 tile = 0; tile <= last_end; tile += tile_len) {
                const u64 mine = scan_tile(hay, tile, last_end, s_pattern, top, min_ngram, src);
                if (mine != NONE_KEY) atomicMin(&s_best, mine);
            }
        }
        __syncthreads();  // every atomicMin is done before thread 0 reads s_best
    }
    if (threadIdx.x == 0) match_keys[b] = s_best;
}

// One block's chunk of one slot's haystack (steps 6, 7 and 8): each slot's haystacks are split into chunks, one
// block each; the block publishes its best key with a global atomicMin and stops once the slot's key beats anything
// left in its chunk.
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
            // Thread 0 reads the slot's global key while the pattern loads: another block may
            // already hold a match this chunk cannot beat.
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
                const u64 mine = scan_tile(hay, tile, last_end, s_pattern, top, min_ngram, src);
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
        }
    }
}

extern "C" __global__ void ngram_one_pass_split(NGRAM_KERNEL_PARAMS) {
    search_chunk(NGRAM_KERNEL_ARGS);
}

// Step 6's phase 2, a launch of its own: step 4's budget scan, the keys reset for the next call (the
// split search lowers each slot's global key from where the last call left it).
extern "C" __global__ void ngram_budget_scan_reset(NGRAM_KERNEL_PARAMS) {
    budget_scan_block(NGRAM_KERNEL_ARGS, /*reset_keys=*/1);
}

extern "C" __global__ void ngram_one_pass_fused(NGRAM_KERNEL_PARAMS) {
    search_chunk(NGRAM_KERNEL_ARGS);
    __shared__ int s_last;
    // The last block to finish runs phase 2 (all keys are final once every block has counted).
    last_block_budget(s_last, NGRAM_KERNEL_ARGS);
}

// Step 7: step 6 with phase 2 launched early (a programmatic dependent launch, Hopper). Step 6's second launch
// costs a captured graph the gap between two dependent kernels; launched early, phase 2's block is scheduled once
// every search block has started and waits at griddepcontrol.wait, which returns when the search grid has finished
// and its writes are visible. Without an early launch, both instructions do nothing.
extern "C" __global__ void ngram_one_pass_split_early(NGRAM_KERNEL_PARAMS) {
    asm volatile("griddepcontrol.launch_dependents;");  // phase 2 may be scheduled now
    search_chunk(NGRAM_KERNEL_ARGS);
}

extern "C" __global__ void ngram_budget_scan_early(NGRAM_KERNEL_PARAMS) {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // the search grid's keys are final and visible
    budget_scan_block(NGRAM_KERNEL_ARGS, /*reset_keys=*/1);
}
