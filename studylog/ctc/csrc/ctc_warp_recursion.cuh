// One direction of the recursion on one warp, steps 9 to 13 of chapter 4: everything but the update of a frame,
// which steps 9 and 11 bring (Update::frame).
#pragma once

#include "ctc_common.cuh"       // NEG_INF
#include "ctc_branch_free.cuh"  // warp_max_of
#include "ctc_recursion.cuh"    // RECURSION_PARAMS, lane_positions, prefetch_emissions, refill_emissions, lane_max,
                                // store_row

// One direction for one utterance. Lane l owns positions s = l V .. l V + V - 1 (V even, so position i of a lane
// is a blank for even i and label j = l V / 2 + (i + 1) / 2 for odd i). The emissions are prefetched
// PREFETCH_FRAMES frames ahead; REDUX: the row maximum as one redux.sync (warp_max_of). Every frame,
// Update::frame<V, BACKWARD>(r, eb, el, valid, skip, prev_max, lane) turns the lane's old row r into the new one,
// prev_max (the old row's maximum) subtracted. Every row is written out (rows (2, N, T, 32 V)) with its base-2
// offset (row_shift (2, N, T), double).
template <class Update, int V, int PREFETCH_FRAMES, bool REDUX, bool BACKWARD>
__device__ __forceinline__ void warp_recursion_direction(RECURSION_PARAMS) {
    constexpr int H = V / 2;  // labels per lane
    const int n = blockIdx.x, lane = threadIdx.x;
    const int Tn = __ldg(input_lengths + n);
    const int L = __ldg(target_lengths + n);
    const int S = 2 * L + 1;
    const int s0 = lane * V;

    unsigned valid, skip;  // bit i: position s0 + i exists / takes the s -/+ 2 transition
    float r[V];            // the lane's share of the row before the first frame (alpha) or after the last (beta)
    lane_positions<V, BACKWARD>(labels, n, Lmax, L, lane, valid, skip, r);

    const size_t stride = 32 * V;
    float* out_rows = rows + ((size_t)(BACKWARD ? N + n : n) * T) * stride + s0;
    double* out_shift = row_shift + (size_t)(BACKWARD ? N + n : n) * T;
    const float* em_base = emissions + (size_t)n * T * (Lmax + 1);
    float eb[PREFETCH_FRAMES];     // blank emission of the frame in each prefetch slot
    float el[PREFETCH_FRAMES][H];  // the lane's label emissions
    prefetch_emissions<H, PREFETCH_FRAMES, BACKWARD>(em_base, Tn, Lmax, lane, L, eb, el);

    double shift = 0.0;  // log2 alpha (or beta) of frame t = r + shift
    for (int k0 = 0; k0 < Tn; k0 += PREFETCH_FRAMES) {
#pragma unroll
        for (int p = 0; p < PREFETCH_FRAMES; ++p) {
            const int k = k0 + p;
            if (k < Tn) {  // the same for the whole warp
                const int t = BACKWARD ? Tn - 1 - k : k;
                // the old row's maximum is reduced alongside the update and subtracted after it
                float prev_max = warp_max_of<REDUX>(lane_max<V>(r));
                prev_max = prev_max == NEG_INF ? 0.0f : prev_max;
                Update::template frame<V, BACKWARD>(r, eb[p], el[p], valid, skip, prev_max, lane);
                shift += prev_max;
                if (s0 < S) store_row<V>(out_rows + (size_t)t * stride, r);
                if (lane == 0) out_shift[t] = shift;
                // refill this slot with the frame PREFETCH_FRAMES steps ahead
                refill_emissions<H, PREFETCH_FRAMES, BACKWARD>(em_base, k + PREFETCH_FRAMES, Tn, Lmax, lane, L, eb, el,
                                                               p);
            }
        }
    }
}

// Both directions, grid (N, 2), block 32: blockIdx.y = 0 runs alpha forward in time, 1 runs beta backward.
template <class Update, int V, int PREFETCH_FRAMES, bool REDUX>
__device__ __forceinline__ void warp_recursion(RECURSION_PARAMS) {
    if (blockIdx.y == 0)
        warp_recursion_direction<Update, V, PREFETCH_FRAMES, REDUX, false>(RECURSION_ARGS);
    else
        warp_recursion_direction<Update, V, PREFETCH_FRAMES, REDUX, true>(RECURSION_ARGS);
}
