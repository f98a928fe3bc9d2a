/* Step 1, the CPU path: the serial n-gram matcher that speculative decoding ran on the host, as the C loop a
 * serving engine would ship. It must stay bit-identical to studylog.ngram.reference_ngram_match, the specification.
 *
 * All sums are int64, so no input the wrapper accepts can overflow them. Returns the number of windows compared:
 * the benchmark predicts from it how long the one-thread GPU kernel (step 2, the same loop) would take.
 */
#include <stdint.h>

/* Leftmost window hay[i .. i+n) equal to pattern[0 .. n) that still has a token after it
 * (i + n < hay_len), or -1. Windows with no continuation are skipped, as the deployed loop did. */
static int64_t leftmost_with_continuation(const int64_t *hay, int64_t hay_len, const int64_t *pattern,
                                          int n, int64_t *windows) {
    for (int64_t i = 0; i + n <= hay_len; ++i) {
        ++*windows;
        int j = 0;
        while (j < n && hay[i + j] == pattern[j]) ++j;
        if (j == n && i + n < hay_len) return i;
    }
    return -1;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int64_t ngram_match_cpu(const int64_t *prompt_ids, const int32_t *prompt_lens, int64_t prompt_width,
                        const int64_t *generated_ids, const int32_t *step_idx, int64_t gen_width,
                        const int32_t *draft_token_num, const int32_t *max_dec_len,
                        const int32_t *seq_lens_encoder, const int32_t *seq_lens_decoder,
                        int32_t *seq_lens_this_time, int64_t *draft_tokens, int64_t draft_width,
                        int64_t batch, int max_ngram, int min_ngram, int64_t threshold, int hybrid,
                        int max_draft_tokens) {
    int64_t windows = 0;
    /* Slots that still need at least one token this step ("unprocessed" in the deployed code). */
    int64_t unprocessed = 0;
    for (int64_t b = 0; b < batch; ++b) {
        if (hybrid ? seq_lens_decoder[b] > 0 : (seq_lens_encoder[b] > 0 || seq_lens_decoder[b] > 0)) ++unprocessed;
    }
    int64_t total = 0; /* sum of seq_lens_this_time over the slots already visited */
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t dec_room = (int64_t)max_dec_len[b] - step_idx[b] - 1;
        int64_t base, cap;
        if (!hybrid) {
            cap = min64(draft_token_num[b], dec_room);
            if (seq_lens_encoder[b] > 0) { total += seq_lens_this_time[b]; continue; } /* prefill: untouched */
            if (seq_lens_decoder[b] == 0) { seq_lens_this_time[b] = 0; continue; }     /* inactive */
            seq_lens_this_time[b] = 1; /* the token the target model verifies anyway */
            base = 1;
        } else {
            base = seq_lens_this_time[b]; /* tokens MTP already put in the slot */
            const int64_t room = (int64_t)max_draft_tokens - base + 1;
            if (base == 0 || room <= 0 || dec_room <= 0) { total += base; continue; } /* untouched */
            cap = min64(room, dec_room);
        }
        --unprocessed;
        const int64_t sum = total + base;
        const int64_t left = unprocessed;
        if (sum + cap + left > threshold) cap = min64(cap, threshold - sum - left);
        total = sum;
        if (sum + left >= threshold - 1) continue; /* the batch budget leaves no room for drafts */

        const int64_t step = step_idx[b];
        const int64_t *prompt = prompt_ids + b * prompt_width;
        const int64_t *gen = generated_ids + b * gen_width;
        int64_t *draft = draft_tokens + b * draft_width;
        for (int n = max_ngram; n >= min_ngram; --n) {
            if (step < n) continue;
            const int64_t *pattern = gen + step + 1 - n; /* the last n generated tokens */
            const int64_t *hay = prompt;
            int64_t hay_len = prompt_lens[b];
            int64_t i = cap >= 1 ? leftmost_with_continuation(hay, hay_len, pattern, n, &windows) : -1;
            if (i < 0) {
                hay = gen;
                hay_len = step; /* generated tokens before the newest one */
                i = cap >= 1 ? leftmost_with_continuation(hay, hay_len, pattern, n, &windows) : -1;
            }
            if (i >= 0) {
                const int64_t start = i + n;
                const int64_t drafted = min64(cap, hay_len - start);
                for (int64_t k = 0; k < drafted; ++k) draft[base + k] = hay[start + k];
                seq_lens_this_time[b] = (int32_t)(base + drafted);
                total = sum + drafted;
                break;
            }
        }
    }
    return windows;
}
