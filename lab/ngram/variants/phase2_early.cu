// Step 6 with its phase 2 launched early (a programmatic dependent launch, Hopper): the second launch of step 6
// costs a captured graph the gap between two dependent kernels; launched with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, phase 2's block is scheduled before the search ends and
// waits at griddepcontrol.wait, which returns once the search grid has finished and its writes are visible.
//
//   "6 early":   the library's ngram_one_pass_split unchanged (its blocks let phase 2 launch as they exit),
//                then ngram_budget_scan_reset_wait, launched early;
//   "6 trigger": ngram_one_pass_split_trigger (step 6's search kernel with griddepcontrol.launch_dependents as its
//                first instruction: phase 2 may launch once every search block has started), then the same phase 2.
#include "ngram_one_pass.cu"

extern "C" __global__ void ngram_budget_scan_reset_wait(NGRAM_KERNEL_PARAMS) {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // the search grid's keys are final and visible
    budget_scan_block(NGRAM_KERNEL_ARGS, /*reset_keys=*/1);
}

extern "C" __global__ void ngram_one_pass_split_trigger(NGRAM_KERNEL_PARAMS) {
    // Phase 2 may be scheduled once every block of this grid has started (it waits for the whole grid to
    // finish, and its writes to be visible, at griddepcontrol.wait).
    asm volatile("griddepcontrol.launch_dependents;");
    const int b = blockIdx.x;
    const int chunk = blockIdx.y;
    const int src = chunk >= prompt_chunks;  // 0: a prompt chunk, 1: a chunk of generated tokens
    __shared__ i64 s_pattern[NGRAM_MAX];
    __shared__ u64 s_best;
    __shared__ int s_stop;
    if (b < batch) {  // uniform over the block
        const SlotPlan p = plan_slot(b, SLOT_ARGS);
        const int step = step_idx[b];
        const int top = min(max_ngram, step);
        const i64 *gen = generated_ids + (i64)b * gen_width;
        const i64 *hay = src ? gen : prompt_ids + (i64)b * prompt_width;
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
