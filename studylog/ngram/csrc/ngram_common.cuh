// Shared pieces of the n-gram matching kernels (chapter 3). Every kernel takes the same parameter list
// (NGRAM_KERNEL_PARAMS), so one Python launcher serves all steps; each step ignores the parameters it does not need.
#pragma once

typedef long long i64;
typedef unsigned long long u64;

#define NGRAM_MAX 32                      // largest n the kernels accept (the wrapper checks)
#define NONE_KEY 0xffffffffffffffffull    // "no match" (larger than every real key)

#define NGRAM_KERNEL_PARAMS                                                                      \
    const i64 *__restrict__ prompt_ids, const int *__restrict__ prompt_lens, i64 prompt_width,   \
    const i64 *__restrict__ generated_ids, const int *__restrict__ step_idx, i64 gen_width,      \
    const int *__restrict__ draft_token_num, const int *__restrict__ max_dec_len,                \
    const int *__restrict__ seq_lens_encoder, const int *__restrict__ seq_lens_decoder,          \
    int *seq_lens_this_time, i64 *draft_tokens, i64 draft_width,                                 \
    u64 *match_keys, unsigned int *blocks_done,                                                  \
    int batch, int max_ngram, int min_ngram, int threshold, int hybrid, int max_draft_tokens,    \
    int prompt_chunks, int chunk_len

// The same names, as arguments (to pass the whole list on to a device function).
#define NGRAM_KERNEL_ARGS                                                                        \
    prompt_ids, prompt_lens, prompt_width, generated_ids, step_idx, gen_width, draft_token_num, \
    max_dec_len, seq_lens_encoder, seq_lens_decoder, seq_lens_this_time, draft_tokens,           \
    draft_width, match_keys, blocks_done, batch, max_ngram, min_ngram, threshold, hybrid,        \
    max_draft_tokens, prompt_chunks, chunk_len

#define SLOT_ARGS                                                                                \
    hybrid, max_draft_tokens, step_idx, draft_token_num, max_dec_len, seq_lens_encoder,         \
    seq_lens_decoder, seq_lens_this_time

__device__ __forceinline__ i64 min64(i64 a, i64 b) { return a < b ? a : b; }

// What the batch loop does with a slot, before any search (the Python reference's rules).
#define SLOT_KEEP 0    // left alone: prefill (ngram), or nothing to add (hybrid)
#define SLOT_ZERO 1    // inactive: seq_lens_this_time = 0
#define SLOT_ACTIVE 2  // decoding: keeps `base` tokens and may get drafts after them

struct SlotPlan {
    int kind;
    int counted;  // counts in "unprocessed" when the batch loop starts
    i64 base;     // ACTIVE: tokens before the drafts; KEEP: its seq_lens_this_time (0 for ZERO)
    i64 cap;      // ACTIVE: draft cap before the batch budget
};

__device__ __forceinline__ SlotPlan plan_slot(int b, int hybrid, int max_draft_tokens, const int *step_idx,
                                              const int *draft_token_num, const int *max_dec_len,
                                              const int *seq_lens_encoder, const int *seq_lens_decoder,
                                              const int *seq_lens_this_time) {
    SlotPlan p;
    const i64 dec_room = (i64)max_dec_len[b] - step_idx[b] - 1;
    if (!hybrid) {
        p.counted = seq_lens_encoder[b] > 0 || seq_lens_decoder[b] > 0;
        p.cap = min64(draft_token_num[b], dec_room);
        if (seq_lens_encoder[b] > 0) {
            p.kind = SLOT_KEEP;
            p.base = seq_lens_this_time[b];
        } else if (seq_lens_decoder[b] == 0) {
            p.kind = SLOT_ZERO;
            p.base = 0;
        } else {
            p.kind = SLOT_ACTIVE;
            p.base = 1;
        }
    } else {
        const i64 ori = seq_lens_this_time[b];
        const i64 room = (i64)max_draft_tokens - ori + 1;
        p.counted = seq_lens_decoder[b] > 0;
        p.base = ori;
        p.cap = min64(room, dec_room);
        p.kind = (ori == 0 || room <= 0 || dec_room <= 0) ? SLOT_KEEP : SLOT_ACTIVE;
    }
    return p;
}

// A match as one 64-bit key. The winner is the largest n, then the prompt before the
// generated tokens, then the leftmost start: (rank << 32 | start) with a rank that grows as
// n shrinks orders all three, so one atomicMin keeps the winner.
__device__ __forceinline__ u64 make_key(int n, int src, i64 start) {
    const u64 rank = 2ull * (u64)(NGRAM_MAX - n) + (u64)src;
    return (rank << 32) | (u64)start;
}
__device__ __forceinline__ int key_n(u64 key) { return NGRAM_MAX - (int)(key >> 33); }
__device__ __forceinline__ int key_src(u64 key) { return (int)((key >> 32) & 1ull); }
__device__ __forceinline__ i64 key_start(u64 key) { return (i64)(key & 0xffffffffull); }

// The smallest key a tile whose ends start at `tile` could still produce (early exit: once the
// best key found is at most this, nothing from `tile` on can win).
__device__ __forceinline__ u64 tile_floor_key(int top, int src, i64 tile) {
    const i64 first_start = tile - top + 1;
    return make_key(top, src, first_start > 0 ? first_start : 0);
}

// Declares what a block of a split search (steps 6 to 12) knows of slot b before its chunk: the slot's plan `p`,
// its newest token's index `step`, the top n `top`, its generated tokens `gen` and its haystack `hay` (src 0: the
// prompt; 1: the generated tokens). A macro, as NGRAM_KERNEL_PARAMS: returned in a struct, they compile differently.
#define SLOT_OF_BLOCK                                                                            \
    const SlotPlan p = plan_slot(b, SLOT_ARGS);                                                  \
    const int step = step_idx[b];                                                                \
    const int top = min(max_ngram, step);                                                        \
    const i64 *gen = generated_ids + (i64)b * gen_width;                                         \
    const i64 *hay = src ? gen : prompt_ids + (i64)b * prompt_width

// Reads a value other blocks update with atomics (bypasses the SM's L1, which may be stale).
__device__ __forceinline__ u64 load_shared_key(const u64 *p) { return *(const volatile u64 *)p; }

// Drafts the slot would get with no batch budget: 0 without a match.
__device__ __forceinline__ i64 tentative_drafted(u64 key, const SlotPlan &p, int prompt_len, int step) {
    if (p.kind != SLOT_ACTIVE || key == NONE_KEY || p.cap < 1) return 0;
    const i64 hay_len = key_src(key) ? (i64)step : (i64)prompt_len;
    return min64(p.cap, hay_len - key_start(key) - key_n(key));
}

// Copies `drafted` tokens following the match into draft_tokens[b, base ...]. __restrict__ tells the compiler the
// buffers never overlap, so it may unroll and read ahead of the writes (ld.global.nc); without it, each load issues
// only after the previous store, which waits for its own load: one memory latency per token.
__device__ __forceinline__ void write_draft(u64 key, i64 drafted, i64 base, const i64 *__restrict__ prompt_row,
                                            const i64 *__restrict__ gen_row, i64 *__restrict__ draft_row) {
    const i64 *__restrict__ src = (key_src(key) ? gen_row : prompt_row) + key_start(key) + key_n(key);
    i64 *__restrict__ dst = draft_row + base;
    for (i64 k = 0; k < drafted; ++k) dst[k] = src[k];
}

// The batch budget walked on one thread, slot after slot, as the Python reference's batch loop
// does (steps 2 and 3). `drafts(b, p, room)` gives an active slot's drafts, written to
// draft_tokens, within `room`, the drafts the batch budget allows it.
template <typename Drafts>
__device__ __forceinline__ void walk_budget(NGRAM_KERNEL_PARAMS, Drafts drafts) {
    i64 unprocessed = 0;
    for (int b = 0; b < batch; ++b) unprocessed += plan_slot(b, SLOT_ARGS).counted;

    i64 total = 0;  // sum of this step's seq_lens_this_time over the slots already visited
    for (int b = 0; b < batch; ++b) {
        const SlotPlan p = plan_slot(b, SLOT_ARGS);
        if (p.kind == SLOT_KEEP) { total += p.base; continue; }
        if (p.kind == SLOT_ZERO) { seq_lens_this_time[b] = 0; continue; }
        unprocessed -= 1;
        const i64 sum = total + p.base;
        const i64 drafted = drafts(b, p, (i64)threshold - sum - unprocessed);
        seq_lens_this_time[b] = (int)(p.base + drafted);
        total = sum + drafted;
    }
}

// Inclusive prefix sum over the block (blockDim.x a multiple of 32); *total gets the block's sum.
__device__ __forceinline__ i64 block_inclusive_scan(i64 v, i64 *s_warp, i64 *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int d = 1; d < 32; d <<= 1) {
        const i64 other = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += other;
    }
    if (lane == 31) s_warp[warp] = v;
    __syncthreads();
    if (warp == 0) {
        i64 w = lane < warps ? s_warp[lane] : 0;
        for (int d = 1; d < 32; d <<= 1) {
            const i64 other = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += other;
        }
        if (lane < warps) s_warp[lane] = w;
    }
    __syncthreads();
    const i64 result = v + (warp > 0 ? s_warp[warp - 1] : 0);
    *total = s_warp[warps - 1];
    __syncthreads();  // s_warp is reused by the next call
    return result;
}

// Phase 2, exact and parallel (steps 4 to 11). Until the first slot where the budget bites, every slot keeps its
// tentative count, so an exclusive prefix sum of tentative counts is the true running sum; that first slot gets what
// room is left; every active slot after it gets no drafts. One block walks the batch
// blockDim.x slots at a time, carrying the running sums between chunks. With reset_keys, it also leaves match_keys as
// NONE_KEY for the next call (the split search's scratch, steps 6 to 12).
__device__ void budget_scan_block(NGRAM_KERNEL_PARAMS, int reset_keys) {
    __shared__ i64 s_warp[32];
    __shared__ int s_first;
    const int tid = threadIdx.x;

    i64 counted = 0;
    for (int b = tid; b < batch; b += blockDim.x)
        counted += plan_slot(b, SLOT_ARGS).counted;
    i64 counted_total;
    block_inclusive_scan(counted, s_warp, &counted_total);

    i64 total_before = 0;   // sum of final counts of earlier chunks (needed only until the crossing)
    i64 active_before = 0;  // active slots in earlier chunks
    int crossed = 0;        // the budget bit in an earlier chunk (uniform over the block)
    for (int chunk = 0; chunk < batch; chunk += blockDim.x) {
        const int b = chunk + tid;
        const bool valid = b < batch;
        SlotPlan p = {SLOT_KEEP, 0, 0, 0};
        u64 key = NONE_KEY;
        i64 drafted_t = 0;
        if (valid) {
            p = plan_slot(b, SLOT_ARGS);
            key = load_shared_key(match_keys + b);
            drafted_t = tentative_drafted(key, p, prompt_lens[b], step_idx[b]);
        }
        const int active = p.kind == SLOT_ACTIVE;
        const i64 final_t = p.base + drafted_t;  // ZERO: base is 0
        i64 chunk_total, chunk_active;
        const i64 incl_total = block_inclusive_scan(final_t, s_warp, &chunk_total);
        const i64 incl_active = block_inclusive_scan((i64)active, s_warp, &chunk_active);
        const i64 sum = total_before + incl_total - final_t + p.base;       // the reference's `sum`
        const i64 left = counted_total - (active_before + incl_active);    // the reference's `left`
        const i64 room = (i64)threshold - sum - left;                      // drafts the budget allows
        const bool crosses = valid && active && drafted_t > 0 && (room < 2 || drafted_t > room);

        if (tid == 0) s_first = 0x7fffffff;
        __syncthreads();
        if (crosses) atomicMin(&s_first, b);
        __syncthreads();
        const int first = s_first;
        __syncthreads();  // everyone has read s_first before it is reset

        if (valid) {
            i64 drafted = drafted_t;
            if (crossed || b > first) drafted = 0;
            else if (b == first) drafted = room >= 2 ? room : 0;
            if (active) {
                seq_lens_this_time[b] = (int)(p.base + drafted);
                if (drafted > 0)
                    write_draft(key, drafted, p.base, prompt_ids + (i64)b * prompt_width,
                                generated_ids + (i64)b * gen_width, draft_tokens + (i64)b * draft_width);
            } else if (p.kind == SLOT_ZERO) {
                seq_lens_this_time[b] = 0;
            }
            if (reset_keys) match_keys[b] = NONE_KEY;
        }
        total_before += chunk_total;
        active_before += chunk_active;
        crossed |= first != 0x7fffffff;
    }
}

// The end of a fused launch (steps 8 to 12): the last block to finish runs phase 2, once every
// block has counted itself done (all keys are final then). `s_last` is the caller's shared flag.
__device__ __forceinline__ void last_block_budget(int &s_last, NGRAM_KERNEL_PARAMS) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();  // this block's key updates are visible before it counts itself done
        s_last = atomicAdd(blocks_done, 1u) == gridDim.x * gridDim.y - 1;
    }
    __syncthreads();
    if (s_last) {
        __threadfence();
        budget_scan_block(NGRAM_KERNEL_ARGS, /*reset_keys=*/1);
        if (threadIdx.x == 0) *blocks_done = 0;  // ready for the next launch
    }
}
