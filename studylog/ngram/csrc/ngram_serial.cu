// Step 2: the CPU loop moved to the GPU as it is, on one thread (<<<1, 1>>>): no copies and no synchronisation
// any more, but one thread walks every slot, every n and every window in turn.
#include "ngram_common.cuh"

// Leftmost window hay[i .. i+n) equal to pattern[0 .. n) with a token after it, or -1.
__device__ i64 serial_leftmost(const i64 *hay, i64 hay_len, const i64 *pattern, int n) {
    for (i64 i = 0; i + n < hay_len; ++i) {
        int j = 0;
        while (j < n && hay[i + j] == pattern[j]) ++j;
        if (j == n) return i;
    }
    return -1;
}

extern "C" __global__ void ngram_serial(NGRAM_KERNEL_PARAMS) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    walk_budget(NGRAM_KERNEL_ARGS, [&](int b, const SlotPlan &p, i64 room) {
        i64 drafted = 0;
        u64 key = NONE_KEY;
        if (room >= 2 && p.cap >= 1) {
            const int step = step_idx[b];
            const i64 *prompt = prompt_ids + (i64)b * prompt_width;
            const i64 *gen = generated_ids + (i64)b * gen_width;
            for (int n = min(max_ngram, step); n >= min_ngram && key == NONE_KEY; --n) {
                const i64 *pattern = gen + step + 1 - n;  // the last n generated tokens
                i64 i = serial_leftmost(prompt, prompt_lens[b], pattern, n);
                if (i >= 0) { key = make_key(n, 0, i); break; }
                i = serial_leftmost(gen, step, pattern, n);
                if (i >= 0) key = make_key(n, 1, i);
            }
            drafted = min64(tentative_drafted(key, p, prompt_lens[b], step), room);
            if (drafted > 0) write_draft(key, drafted, p.base, prompt, gen, draft_tokens + (i64)b * draft_width);
        }
        return drafted;
    });
}
