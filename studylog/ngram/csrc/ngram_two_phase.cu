// Steps 3 and 4: two phases. Phase 1, ngram_search_per_n <<<batch, threads>>>: a block per slot searches its
// haystacks in parallel, one n and one haystack at a time, keeps the leftmost match with a 64-bit atomicMin in
// shared memory and writes one key per slot (ngram_common.cuh). Phase 2 turns keys into drafts under the batch
// budget: step 3's ngram_budget_serial <<<1, 1>>> walks it as step 2 does, step 4's ngram_budget_scan <<<1, 1024>>>
// gets the same result from block-wide prefix sums.
#include "ngram_common.cuh"

extern "C" __global__ void ngram_search_per_n(NGRAM_KERNEL_PARAMS) {
    const int b = blockIdx.x;
    if (b >= batch) return;  // uniform over the block
    __shared__ u64 s_best;
    const SlotPlan p = plan_slot(b, SLOT_ARGS);
    const int step = step_idx[b];
    u64 key = NONE_KEY;  // the same value in every thread (read from shared memory after a barrier)
    if (p.kind == SLOT_ACTIVE && p.cap >= 1) {
        const i64 *prompt = prompt_ids + (i64)b * prompt_width;
        const i64 *gen = generated_ids + (i64)b * gen_width;
        for (int n = min(max_ngram, step); n >= min_ngram && key == NONE_KEY; --n) {
            const i64 *pattern = gen + step + 1 - n;
            for (int src = 0; src < 2 && key == NONE_KEY; ++src) {
                const i64 *hay = src ? gen : prompt;
                const i64 last_start = (src ? (i64)step : (i64)prompt_lens[b]) - n - 1;  // keeps a token after
                if (threadIdx.x == 0) s_best = NONE_KEY;
                __syncthreads();
                for (i64 i = threadIdx.x; i <= last_start; i += blockDim.x) {
                    int j = 0;
                    while (j < n && hay[i + j] == pattern[j]) ++j;
                    if (j == n) {
                        atomicMin(&s_best, (u64)i);
                        break;  // this thread's later windows lie further right
                    }
                }
                __syncthreads();
                const u64 best = s_best;
                __syncthreads();  // everyone has read s_best before thread 0 resets it
                if (best != NONE_KEY) key = make_key(n, src, (i64)best);
            }
        }
    }
    if (threadIdx.x == 0) match_keys[b] = key;
}

extern "C" __global__ void ngram_budget_serial(NGRAM_KERNEL_PARAMS) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    walk_budget(NGRAM_KERNEL_ARGS, [&](int b, const SlotPlan &p, i64 room) {
        const u64 key = match_keys[b];
        i64 drafted = 0;
        if (room >= 2) {
            drafted = min64(tentative_drafted(key, p, prompt_lens[b], step_idx[b]), room);
            if (drafted > 0)
                write_draft(key, drafted, p.base, prompt_ids + (i64)b * prompt_width,
                            generated_ids + (i64)b * gen_width, draft_tokens + (i64)b * draft_width);
        }
        return drafted;
    });
}

extern "C" __global__ void ngram_budget_scan(NGRAM_KERNEL_PARAMS) {
    budget_scan_block(NGRAM_KERNEL_ARGS, /*reset_keys=*/0);
}
